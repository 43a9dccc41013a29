"""Container formats are read the way their loaders read them, and a loader's refusal never ends 'safe'.

Each payload is built by hand (nothing here is unpickled); where a test claims a loader would read
the bytes, it shows it with that loader's own reader (torch's PyTorchFileReader, tarfile, numpy's
header parser) without loading the pickle.
"""

from __future__ import annotations

import io
import pickle
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.checkpoint_support import scratch_dir
from tests.fixtures.checkpoint_corpus import dcp_with_item
from tests.fixtures.container_payloads import (
    OBJECT_SPELLINGS,
    PAYLOAD,
    break_crc,
    npy_bytes,
    rename_local,
    tar_bytes,
    torch_zip,
    v7_member,
)
from torch_skills.checkpoint.scan import scan_path
from torch_skills.checkpoint.verdict import overall_verdict

# posix.system("true") called, protocol 2, written by hand


def verdict_and_globals(path: Path) -> tuple[str, set[str], set[str]]:
    scan = scan_path(path)
    codes = {p.code for p in scan.problems_all()}
    return overall_verdict(scan), {u.qualified for u in scan.unsafe()}, codes


@pytest.mark.parametrize("descr", OBJECT_SPELLINGS, ids=str)
def test_every_spelling_of_an_object_dtype_is_scanned_as_a_pickle(tmp_path, descr):
    """numpy builds each of these into a dtype with hasobject, so np.load unpickles the data."""
    assert np.lib.format.descr_to_dtype(descr).hasobject  # numpy's own reading of the header
    path = tmp_path / "a.npy"
    path.write_bytes(npy_bytes(descr))
    verdict, names, _ = verdict_and_globals(path)
    assert verdict == "unsafe" and "posix.system" in names


@pytest.mark.parametrize("version", [(2, 0), (3, 0)])
def test_format_2_and_3_headers_with_object_dtypes_are_scanned(tmp_path, version):
    """Four-byte header lengths (and UTF-8 for 3.0) read like numpy reads them."""
    path = tmp_path / "a.npy"
    path.write_bytes(npy_bytes("object", version))
    with open(path, "rb") as f:
        assert np.lib.format.read_magic(f) == version
    verdict, names, _ = verdict_and_globals(path)
    assert verdict == "unsafe" and "posix.system" in names


def test_a_python2_long_or_negative_shape_still_gets_the_object_array_scanned(tmp_path):
    """numpy strips Python 2's 'L' and unpickles before it uses the shape; so does the scan."""
    for shape in ("(1L,)", "(-1,)"):
        path = tmp_path / "a.npy"
        path.write_bytes(npy_bytes("|O", shape=shape))
        verdict, names, _ = verdict_and_globals(path)
        assert verdict == "unsafe" and "posix.system" in names, shape


@pytest.mark.parametrize("descr", ["f4,O", "object", "T"], ids=str)
def test_object_arrays_spelled_other_ways_inside_an_npz_are_scanned(tmp_path, descr):
    """np.load of an .npz reads each member with the same header rules."""
    path = tmp_path / "a.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("ok.npy", _plain_npy())
        z.writestr("x.npy", npy_bytes(descr, (3, 0)))
    verdict, names, _ = verdict_and_globals(path)
    assert verdict == "unsafe" and "posix.system" in names


def _plain_npy() -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.arange(4, dtype=np.float32))
    return buf.getvalue()


def test_a_plain_numpy_array_stays_safe(tmp_path):
    """A float array with a format 3.0 header is data: no false alarm from the new dtype rule."""
    path = tmp_path / "a.npy"
    np.save(path, np.arange(6, dtype=np.float32).reshape(2, 3))
    verdict, names, _ = verdict_and_globals(path)
    assert verdict == "safe" and not names


# -- torch zips read as torch's zip reader reads them ---------------------------------------------
def test_an_upper_case_data_pkl_with_a_bad_crc_is_scanned_as_torch_reads_it(tmp_path):
    """torch finds DATA.PKL for data.pkl and checks no CRC: the scan reads the same bytes."""
    raw = torch_zip({"archive/DATA.PKL": PAYLOAD, "archive/version": b"3\n"})
    path = tmp_path / "m.pt"
    path.write_bytes(break_crc(raw, b"archive/DATA.PKL"))
    assert bytes(torch._C.PyTorchFileReader(str(path)).get_record("data.pkl")) == PAYLOAD
    verdict, names, codes = verdict_and_globals(path)
    assert verdict == "unsafe" and "posix.system" in names and "unreadable_file" not in codes


def test_a_data_pkl_whose_local_header_names_another_file_is_scanned(tmp_path):
    """Python's zipfile refuses the member; torch reads it; the scan reads it as torch does."""
    raw = torch_zip({"archive/data.pkl": PAYLOAD, "archive/version": b"3\n"})
    path = tmp_path / "m.pt"
    path.write_bytes(rename_local(raw, b"archive/data.pkl", b"archive/xata.pkl"))
    assert bytes(torch._C.PyTorchFileReader(str(path)).get_record("data.pkl")) == PAYLOAD
    verdict, names, codes = verdict_and_globals(path)
    assert verdict == "unsafe" and "posix.system" in names and "zip_local_name_mismatch" in codes


def test_a_pt2_constant_with_a_mismatched_local_name_is_scanned(tmp_path):
    """A pickled .pt2 constant behind a local header naming another file is still found."""
    raw = torch_zip(
        {
            "archive/archive_format": b"pt2",
            "archive/data/constants/tensor_constant_0": PAYLOAD,
            "archive/byteorder": b"little",
        }
    )
    path = tmp_path / "m.pt2"
    path.write_bytes(
        rename_local(
            raw, b"archive/data/constants/tensor_constant_0", b"archive/data/constants/tensor_constant_9"
        )
    )
    verdict, names, _ = verdict_and_globals(path)
    assert verdict == "unsafe" and "posix.system" in names


def test_a_member_that_does_not_inflate_is_a_finding_not_skipped(tmp_path):
    """Deflate bytes that break: a corrupt_zip problem for that member, never a silent skip."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", pickle.dumps({"a": 1}, protocol=2))
        z.writestr("archive/extra.pkl", PAYLOAD * 40)
    raw = bytearray(buf.getvalue())
    at = raw.find(b"archive/extra.pkl") + len(b"archive/extra.pkl")
    raw[at : at + 6] = b"\xff" * 6  # the deflate stream's first bytes
    path = tmp_path / "m.pt"
    path.write_bytes(bytes(raw))
    verdict, _, codes = verdict_and_globals(path)
    assert verdict != "safe" and "corrupt_zip" in codes


def test_a_dcp_bytes_item_that_is_an_upper_case_bad_crc_zip_is_unsafe(tmp_path):
    """DCP's default planner torch.loads bytes items with weights_only=False: that zip is scanned too."""
    item = break_crc(torch_zip({"archive/DATA.PKL": PAYLOAD, "archive/version": b"3\n"}), b"archive/DATA.PKL")
    folder = dcp_with_item(tmp_path / "ckpt", item)
    verdict, names, codes = verdict_and_globals(folder)
    assert verdict == "unsafe" and "posix.system" in names and "dcp_bytes_item_unsafe" in codes


# -- tar archives as torch's legacy loader opens them --------------------------------------------
def test_a_pre_0_4_tar_with_an_extra_member_is_still_the_legacy_format(tmp_path):
    """torch extracts 'storages' by name whatever else is there: the payload in its second pickle counts."""
    storages = pickle.dumps(1, protocol=2) + PAYLOAD
    path = tmp_path / "old.pt"
    path.write_bytes(
        tar_bytes(
            {"sys_info": b"N.", "pickle": b"N.", "storages": storages, "tensors": b"K\x00.", "README": b"hi"}
        )
    )
    verdict, _, codes = verdict_and_globals(path)
    assert verdict == "unsafe" and "legacy_tar_format" in codes


def test_a_v7_tar_whose_first_name_is_a_pickle_is_read_as_atar_bytes(tmp_path):
    """The first 100 bytes parse as a harmless pickle, but tarfile (and torch.load) open it as a tar."""
    raw = v7_member(b"N.", b"x") + v7_member(b"storages", PAYLOAD) + b"\0" * 1024
    path = tmp_path / "old.pt"
    path.write_bytes(raw)
    with tarfile.open(path, mode="r:") as tar:
        assert "storages" in tar.getnames()  # what torch's legacy_load extracts
    verdict, names, codes = verdict_and_globals(path)
    assert verdict == "unsafe" and "posix.system" in names and "legacy_tar_format" in codes


# -- the tool's own loader --------------------------------------------------------------------------
async def test_a_refusal_by_the_tools_own_loader_never_ends_safe(client):
    """A pickle the scan finds harmless but the loader refuses (a persistent id) is not called safe."""
    path = scratch_dir("loader-refuses") / "p.pkl"
    path.write_bytes(b"\x80\x02X\x01\x00\x00\x00aQ.")  # BINPERSID: pickle.load needs persistent_load
    r = await client.call_tool("verify_checkpoint", {"path": str(path)})
    assert not r.is_error, r.content
    result = r.structured_content
    assert not result["safe"] and result["verdict"] != "safe" and result["load_error"]
    assert "loader_refused" in {p["code"] for p in result["problems"]}


def test_load_error_text_never_carries_torchs_weights_only_false_advice():
    """torch's 'Re-running with weights_only=False will likely succeed' is dropped from refusals."""
    from torch_skills.checkpoint.load import _loader_message

    text = (
        "Weights only load failed. (1) Re-running `torch.load` with `weights_only` set to `False` will likely "
        "succeed, but it can result in arbitrary code execution.\n\tWeightsUnpickler error: Unsupported global"
    )
    assert "False" not in _loader_message(ValueError(text), 800)
    assert _loader_message(ValueError(text), 800).startswith("WeightsUnpickler error")
