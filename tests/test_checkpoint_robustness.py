"""Hostile shapes and corrupt bytes: every input ends in a verdict, within bounded cost, never a crash."""

from __future__ import annotations

import functools
import gzip
import io
import pickle
import shutil
import struct
import tarfile
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures.checkpoint_corpus import dcp_save, write_safetensors
from tests.fixtures.checkpoint_models import TinyNet
from tests.fixtures.container_payloads import PAYLOAD, break_crc, npy_bytes, v7_member
from tests.fixtures.container_payloads import torch_zip as zip_of
from tests.fixtures.joblib_format import joblib_bytes, scikit_like
from tests.fixtures.malicious.payloads import Payload
from torch_skills.checkpoint.scan import scan_path
from torch_skills.checkpoint.tree import walk
from torch_skills.checkpoint.verdict import overall_verdict

INTERNAL = "unreadable_file"  # the catch-all: a reader raised something it should have turned into a problem


def verdict_of(path: Path) -> tuple[str, set[str]]:
    scan = scan_path(path)
    return overall_verdict(scan), {p.code for p in scan.problems_all()}


def torch_zip(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_a_zip_bomb_is_refused_from_its_header_before_decompression(tmp_path):
    """A member declaring 256 MiB from a few hundred KiB is flagged by ratio and never inflated."""
    path = tmp_path / "bomb.pt"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", pickle.dumps({"a": 1}, protocol=2))
        z.writestr("archive/extra.pkl", bytes(256 << 20))
    assert path.stat().st_size < 1 << 20
    verdict, codes = verdict_of(path)
    assert verdict == "unsafe" and "zip_bomb" in codes


def test_a_member_whose_header_understates_its_size_is_refused(tmp_path):
    """Compressed bytes larger than deflate could produce for the declared size are a lie, not read."""
    path = tmp_path / "lie.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("m.pkl", bytes(range(256)) * 4096)
    data = bytearray(path.read_bytes())
    for sig, size_at in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):  # uncompressed size fields
        at = data.find(sig)
        data[at + size_at : at + size_at + 4] = struct.pack("<I", 100)
    path.write_bytes(bytes(data))
    verdict, codes = verdict_of(path)
    assert verdict == "unsafe" and "zip_size_lie" in codes


def test_a_gzip_bomb_stops_at_the_ratio_limit(tmp_path):
    """A compressed stream inflating more than 200:1 is reported, not expanded in full."""
    path = tmp_path / "model.pkl.gz"
    path.write_bytes(gzip.compress(bytes(64 << 20), 9))
    verdict, codes = verdict_of(path)
    assert verdict == "unsafe" and "decompression_limit" in codes


def test_walks_enter_each_container_once():
    """A list holding itself and a billion-laughs graph are walked in time linear in their size."""
    me: list = []
    me.extend([me] * 300)
    assert list(walk(me)) == []
    level: list = [torch.ones(1)]
    for _ in range(9):
        level = [level] * 10
    assert len(list(walk(level))) == 1


def test_a_7z_archive_is_unscanned_and_never_safe(tmp_path):
    """No stdlib reader: the archive is reported as unscanned, which blocks a safe verdict."""
    path = tmp_path / "weights.7z"
    path.write_bytes(b"7z\xbc\xaf\x27\x1c\x00\x04" + bytes(64))
    verdict, codes = verdict_of(path)
    assert verdict == "unsafe" and "unscanned_archive" in codes


def test_plain_numpy_files_are_safe_and_object_arrays_are_pickles(tmp_path):
    """float32 .npy/.npz are data; an object array's pickle is scanned and its payload named."""
    np.save(tmp_path / "w.npy", np.ones((2, 3), dtype=np.float32))
    np.savez(tmp_path / "w.npz", a=np.arange(3), b=np.zeros(2))
    assert verdict_of(tmp_path / "w.npy")[0] == "safe"
    assert verdict_of(tmp_path / "w.npz")[0] == "safe"
    arr = np.empty(1, dtype=object)
    arr[0] = Payload(print, ("hi",))
    np.save(tmp_path / "o.npy", arr, allow_pickle=True)
    scan = scan_path(tmp_path / "o.npy")
    assert not scan.safe and [u.qualified for u in scan.unsafe()] == ["builtins.print"]


def test_a_pickle_in_a_tar_member_is_found(tmp_path):
    """Tar members are scanned by content whatever they are called."""
    path = tmp_path / "pack.tar"
    payload = pickle.dumps(Payload(print, ("x",)), protocol=0)
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("dir/blob")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    scan = scan_path(path)
    assert not scan.safe and [u.qualified for u in scan.unsafe()] == ["builtins.print"]


def _zip_with(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def _corrupt_deflate() -> bytes:
    data = bytearray(_zip_with({"archive/data.pkl": pickle.dumps(list(range(2000)), protocol=2)}))
    at = data.find(b"archive/data.pkl") + len("archive/data.pkl") + 10
    data[at : at + 16] = b"\xff" * 16  # the deflate stream itself
    return bytes(data)


def _version_needed_255() -> bytes:
    data = bytearray(_zip_with({"archive/data.pkl": pickle.dumps({"a": 1}, protocol=2)}))
    at = data.find(b"PK\x01\x02")
    data[at + 6] = 255  # central directory "version needed to extract"
    return bytes(data)


def _stored_zip(members: list[tuple[bytes, bytes]]) -> bytes:
    """A zip of stored members written byte by byte (names zipfile refuses to write, like b"")."""
    out, central = bytearray(), bytearray()
    for name, data in members:
        crc, offset = zlib.crc32(data), len(out)
        out += struct.pack(
            "<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 0, 0, 0, crc, len(data), len(data), len(name), 0
        )
        out += name + data
        central += struct.pack(
            "<4sHHHHHHIIIHHHHHII",
            b"PK\x01\x02",
            20,
            20,
            0,
            0,
            0,
            0,
            crc,
            len(data),
            len(data),
            len(name),
            0,
            0,
            0,
            0,
            0,
            offset,
        )
        central += name
    end = struct.pack(
        "<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(members), len(members), len(central), len(out), 0
    )
    return bytes(out + central + end)


def _empty_member_name() -> bytes:
    return _stored_zip([(b"", pickle.dumps({"a": 1}, protocol=2)), (b"x.pkl", pickle.dumps([1], protocol=2))])


def _negative_seek() -> bytes:
    data = bytearray(_zip_with({"archive/data.pkl": pickle.dumps({"a": 1}, protocol=2)}))
    at = data.find(b"PK\x05\x06")
    data[at + 16 : at + 20] = struct.pack("<I", 0xFFFFFF00)  # central directory offset before the file start
    return bytes(data)


CORRUPT = {
    "zlib_error": (".pt", _corrupt_deflate),
    "version_needed_255": (".pt", _version_needed_255),
    "empty_member_name": (".zip", _empty_member_name),
    "negative_seek": (".pt", _negative_seek),
    "truncated_zip": (".pt", lambda: torch_zip({"w": torch.ones(3)})[:300]),
    "truncated_pickle": (".pkl", lambda: pickle.dumps(list(range(100)), protocol=2)[:-20]),
    "truncated_npy": (
        ".npy",
        lambda: (
            b"\x93NUMPY\x01\x00\x76\x00"
            + b"{'descr': '<f4', 'fortran_order': False, 'shape': (1000,), }".ljust(118)
            + b"\n"
            + bytes(8)
        ),
    ),
    "npy_bad_header": (".npy", lambda: b"\x93NUMPY\x01\x00\x10\x00{'descr': __im}\n"),
    "truncated_safetensors": (".safetensors", lambda: struct.pack("<Q", 50) + b'{"w": {"dtype": "F32"'),
    "corrupt_gzip": (".pkl.gz", lambda: gzip.compress(pickle.dumps({"a": 1}))[:-12]),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_input_is_a_verdict_naming_what_and_where(tmp_path, case):
    """zlib errors, version-needed 255, empty names, negative seeks, truncations: corrupt or unsafe, no crash."""
    suffix, build = CORRUPT[case]
    path = tmp_path / f"file{suffix}"
    path.write_bytes(build())
    verdict, codes = verdict_of(path)
    assert verdict in ("corrupt", "unsafe"), (case, codes)
    assert INTERNAL not in codes, (case, codes)


def test_dcp_metadata_with_fields_of_the_wrong_type_is_bad_metadata(tmp_path):
    """A real .metadata whose chunk offsets are an int instead of a list is reported, not raised."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    folder = tmp_path / "dcp"
    dcp_save({"model": TinyNet().state_dict()}, folder)
    md = pickle.loads((folder / ".metadata").read_bytes())  # our own benign file
    for meta in md.state_dict_metadata.values():
        if hasattr(meta, "chunks"):
            meta.chunks[0] = ChunkStorageMetadata(offsets=5, sizes=7)
            break
    (folder / ".metadata").write_bytes(pickle.dumps(md))
    verdict, codes = verdict_of(folder)
    assert verdict == "corrupt" and "dcp_bad_metadata" in codes and INTERNAL not in codes, codes


def test_a_malformed_dcp_metadata_file_is_a_verdict(tmp_path):
    """A .metadata that decodes to the wrong shapes is reported as bad metadata, not an exception."""
    folder = tmp_path / "dcp"
    dcp_save({"model": TinyNet().state_dict()}, folder)
    (folder / ".metadata").write_bytes(pickle.dumps({"state_dict_metadata": 5}, protocol=2))
    verdict, codes = verdict_of(folder)
    assert verdict in ("corrupt", "unsafe") and INTERNAL not in codes, codes


# -- time-boxed mutation fuzz ---------------------------------------------------------------------
def _seeds(tmp: Path) -> dict[str, tuple[str, bytes]]:
    net = TinyNet()
    st_path = tmp / "seed.safetensors"
    write_safetensors(st_path, dict(net.state_dict()), {"format": "pt"})
    return {
        "zip": (".pt", torch_zip({"w": torch.ones(2, 2), "step": 3})),
        "pickle": (".pkl", pickle.dumps({"lr": 0.1, "a": np.arange(3), "t": (1, "x")}, protocol=4)),
        "pickle0": (".pkl", pickle.dumps({"lr": 0.1, "t": [1, "x"]}, protocol=0)),
        "safetensors": (".safetensors", st_path.read_bytes()),
        "npz": (
            ".npz",
            _zip_with(
                {
                    "a.npy": b"\x93NUMPY\x01\x00\x76\x00"
                    + b"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }".ljust(118)
                    + b"\n"
                    + bytes(8)
                }
            ),
        ),
    }


_MUTATION = st.tuples(st.integers(0, 4), st.integers(0, 1 << 30), st.binary(min_size=0, max_size=8))


def _apply(data: bytes, mutations) -> bytes:
    b = bytearray(data)
    for kind, at, blob in mutations:
        if not b:
            break
        at %= len(b)
        if kind == 0:
            b[at : at + len(blob)] = blob
        elif kind == 1:
            del b[at : at + 1 + len(blob)]
        elif kind == 2:
            b[at:at] = blob
        elif kind == 3:
            b = b[: at + 1]
        else:
            b[at] ^= 0xFF
    return bytes(b)


class _Scripted(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2


@functools.cache
def _reader_seeds() -> dict[str, tuple[str, bytes]]:
    """Seeds for the readers added for issue 25 (built once: scripting is slow)."""
    scripted = io.BytesIO()
    torch.jit.save(torch.jit.script(_Scripted()), scripted)
    benign_npy = npy_bytes("object", (3, 0))[: -len(PAYLOAD)] + pickle.dumps(["a", 1], protocol=2)
    return {
        "npy3_object": (".npy", benign_npy),
        "joblib": (".joblib", joblib_bytes(scikit_like())),
        "torchscript": (".pt", scripted.getvalue()),
        "v7_tar": (".pt", v7_member(b"N.", b"x") + v7_member(b"storages", b"K\x01.") + bytes(1024)),
        "upper_crc_zip": (
            ".pt",
            break_crc(zip_of({"archive/DATA.PKL": pickle.dumps({"a": 1}, 2)}), b"archive/DATA.PKL"),
        ),
    }


_SEEDS = st.sampled_from(
    [
        "zip",
        "pickle",
        "pickle0",
        "safetensors",
        "npz",
        "npy3_object",
        "joblib",
        "torchscript",
        "v7_tar",
        "upper_crc_zip",
    ]
)
_MUTATIONS = st.lists(_MUTATION, min_size=1, max_size=4)


def _fuzz_once(tmp: Path, seed: str, mutations) -> None:
    suffix, data = _reader_seeds()[seed] if seed in _reader_seeds() else _seeds(tmp)[seed]
    path = tmp / f"m{suffix}"
    path.write_bytes(_apply(data, mutations))
    verdict, codes = verdict_of(path)
    assert INTERNAL not in codes, codes
    assert verdict in ("safe", "safe_with_allowlist", "unsafe", "corrupt")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=_SEEDS, mutations=_MUTATIONS)
def test_mutated_zip_pickle_safetensors_and_numpy_bytes_never_cause_an_internal_error(
    tmp_path_factory, seed, mutations
):
    """Random flips, cuts and inserts give a verdict; no reader exception escapes to the catch-all."""
    _fuzz_once(tmp_path_factory.mktemp("fuzz"), seed, mutations)


@pytest.mark.slow
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=_SEEDS, mutations=_MUTATIONS)
def test_many_mutated_inputs_never_cause_an_internal_error(tmp_path_factory, seed, mutations):
    """The same fuzz with many more examples (slow suite)."""
    _fuzz_once(tmp_path_factory.mktemp("fuzz"), seed, mutations)


@pytest.fixture(scope="module")
def dcp_seed(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("dcp_seed") / "ckpt"
    dcp_save({"model": TinyNet().state_dict(), "epoch": 1}, folder)
    return folder


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    mutations=st.lists(_MUTATION, min_size=1, max_size=3),
    target=st.sampled_from([".metadata", "__0_0.distcp"]),
)
def test_mutated_dcp_folders_never_cause_an_internal_error(tmp_path_factory, dcp_seed, mutations, target):
    """A DCP folder with a mutated .metadata or data file ends in a verdict."""
    folder = tmp_path_factory.mktemp("dcp") / "ckpt"
    shutil.copytree(dcp_seed, folder)
    path = folder / target
    path.write_bytes(_apply(path.read_bytes(), mutations))
    verdict, codes = verdict_of(folder)
    assert INTERNAL not in codes, codes
    assert verdict in ("safe", "safe_with_allowlist", "unsafe", "corrupt")


async def test_a_dcp_item_shorter_than_its_tensor_is_reported_not_a_crash(client):
    """Metadata promising more bytes than an item holds: a corrupt verdict (or load error), never a crash."""
    from tests.checkpoint_support import scratch_dir

    folder = scratch_dir("dcp-short") / "ckpt"
    dcp_save({"model": TinyNet().state_dict()}, folder)
    md = pickle.loads((folder / ".metadata").read_bytes())  # our own benign file
    for index, info in md.storage_data.items():
        if index.fqn.endswith("weight"):
            md.storage_data[index] = type(info)(
                info.relative_path, info.offset, 8, info.transform_descriptors
            )
            break
    (folder / ".metadata").write_bytes(pickle.dumps(md))
    r = await client.call_tool("verify_checkpoint", {"path": str(folder)})
    assert not r.is_error, r.content
    result = r.structured_content
    said_corrupt = result["verdict"] == "corrupt" or "corrupt/unreadable" in (result["load_error"] or "")
    assert said_corrupt and not result["safe"] or result["load_error"], result["summary"]
