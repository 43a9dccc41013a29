"""Hostile-file hygiene: corrupt or lying zips, safetensors headers, shard indexes and DCP folders."""

from __future__ import annotations

import io
import json
import pickle
import struct
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch

from tests.fixtures.checkpoint_corpus import dcp_save, write_safetensors
from tests.fixtures.checkpoint_models import TinyNet
from torch_skills.checkpoint.scan import scan_path
from torch_skills.checkpoint.zip_scan import ZipLimits, scan_zip_file


def codes(path: Path) -> set[str]:
    return {p.code for p in scan_path(path).problems_all()}


def torch_zip_bytes() -> bytes:
    buf = io.BytesIO()
    torch.save(TinyNet().state_dict(), buf)
    return buf.getvalue()


def patch_central_entry(
    data: bytes,
    member: str,
    *,
    compressed: int | None = None,
    size: int | None = None,
    offset: int | None = None,
) -> bytes:
    """Rewrite one central-directory record's sizes or local-header offset."""
    out = bytearray(data)
    at = out.find(b"PK\x01\x02" + bytes(0))
    while at >= 0:
        name_len = struct.unpack_from("<H", out, at + 28)[0]
        if out[at + 46 : at + 46 + name_len].decode() == member:
            if compressed is not None:
                struct.pack_into("<I", out, at + 20, compressed)
            if size is not None:
                struct.pack_into("<I", out, at + 24, size)
            if offset is not None:
                struct.pack_into("<I", out, at + 42, offset)
            return bytes(out)
        at = out.find(b"PK\x01\x02", at + 4)
    raise KeyError(member)


def test_a_truncated_zip_is_corrupt_and_unsafe(tmp_path):
    """Half a torch.save file has no central directory: a clear problem, never 'safe'."""
    path = tmp_path / "cut.pt"
    path.write_bytes(torch_zip_bytes()[:700])
    scan = scan_path(path)
    assert not scan.safe and "corrupt_zip" in {p.code for p in scan.problems_all()}


def test_member_names_with_dotdot_or_absolute_paths_are_flagged(tmp_path):
    """'../x' and '/abs/y' would escape an extraction folder."""
    path = tmp_path / "names.pt"
    path.write_bytes(torch_zip_bytes())
    with zipfile.ZipFile(path, "a") as z:
        z.writestr("../outside.txt", b"x")
        z.writestr("/etc/cron.d/job", b"x")
    found = codes(path)
    assert {"zip_path_traversal", "zip_absolute_name"} <= found
    assert not scan_path(path).safe


def test_a_member_declaring_more_bytes_than_the_file_holds_is_flagged(tmp_path):
    """A storage record claiming 2 GiB in a tiny file is refused before anything reads it."""
    path = tmp_path / "sizes.pt"
    data = torch_zip_bytes()
    name = next(n for n in zipfile.ZipFile(io.BytesIO(data)).namelist() if "/data/0" in n)
    path.write_bytes(patch_central_entry(data, name, compressed=0x7FFFFFFF, size=0x7FFFFFFF))
    assert "zip_size_beyond_file" in codes(path)


def test_a_deflated_member_with_an_absurd_ratio_is_a_bomb(tmp_path):
    """A member inflating 1000:1 or more is reported as a decompression bomb."""
    path = tmp_path / "bomb.pt"
    path.write_bytes(torch_zip_bytes())
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/extra.bin", b"\x00" * 1000)
    path.write_bytes(patch_central_entry(path.read_bytes(), "archive/extra.bin", size=0x7FFFFFFF))
    assert "zip_bomb" in codes(path)


def test_overlapping_members_are_flagged(tmp_path):
    """Two central-directory entries pointing at one local header overlap."""
    path = tmp_path / "overlap.pt"
    data = torch_zip_bytes()
    infos = zipfile.ZipFile(io.BytesIO(data)).infolist()
    path.write_bytes(patch_central_entry(data, infos[2].filename, offset=infos[1].header_offset))
    assert "zip_overlapping_members" in codes(path)


def test_a_claimed_entry_count_above_the_limit_is_refused_before_listing(tmp_path):
    """The end record is read first; an archive with too many members is not opened."""
    path = tmp_path / "many.pt"
    path.write_bytes(torch_zip_bytes())
    scan = scan_zip_file(path, limits=ZipLimits(max_entries=3))
    assert [p.code for p in scan.problems] == ["zip_too_many_entries"] and not scan.members


def test_a_torchscript_archive_is_recognised_and_not_called_safe(tmp_path):
    """torch.jit.save output has constants.pkl and code/; loading it runs that code."""
    path = tmp_path / "traced.pt"
    torch.jit.save(torch.jit.trace(torch.nn.Linear(2, 2), torch.randn(1, 2)), path)
    scan = scan_path(path)
    assert scan.format == "torchscript" and not scan.safe


def write_raw_safetensors(path: Path, header: bytes, data: bytes = b"", length: int | None = None) -> Path:
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data)
    return path


def good_entry(begin: int = 0, end: int = 16, shape=(2, 2), dtype: str = "F32") -> dict:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": [begin, end]}


# (case, header bytes, data bytes, declared header length or None, expected problem code)
LYING_HEADERS = [
    ("huge length", b"{}", b"", 2**40, "safetensors_header_too_large"),
    ("length past the file", b'{"a": 1}', b"", 5000, "safetensors_header_beyond_file"),
    ("not json", b"{not json", b"", None, "safetensors_bad_header"),
    ("deep json", b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", b"", None, "safetensors_bad_header"),
    (
        "duplicate key",
        b'{"w": ' + json.dumps(good_entry()).encode() + b', "w": ' + json.dumps(good_entry()).encode() + b"}",
        b"\x00" * 16,
        None,
        "safetensors_duplicate_key",
    ),
    (
        "offsets past the data",
        json.dumps({"w": good_entry(0, 64, (4, 4))}).encode(),
        b"\x00" * 16,
        None,
        "safetensors_offsets_beyond_file",
    ),
    (
        "size mismatch",
        json.dumps({"w": good_entry(0, 16, (3, 3))}).encode(),
        b"\x00" * 16,
        None,
        "safetensors_size_mismatch",
    ),
    (
        "overlap",
        json.dumps({"a": good_entry(0, 16), "b": good_entry(8, 24)}).encode(),
        b"\x00" * 24,
        None,
        "safetensors_offsets_overlap",
    ),
    (
        "unknown dtype",
        json.dumps({"w": good_entry(dtype="F128")}).encode(),
        b"\x00" * 16,
        None,
        "safetensors_bad_dtype",
    ),
    (
        "negative dim",
        json.dumps({"w": good_entry(shape=(-2, -2))}).encode(),
        b"\x00" * 16,
        None,
        "safetensors_bad_shape",
    ),
]


@pytest.mark.parametrize(
    ("header", "data", "length", "expected"), [pytest.param(*c[1:], id=c[0]) for c in LYING_HEADERS]
)
def test_lying_safetensors_headers_are_refused(tmp_path, header, data, length, expected):
    """Every hostile number in a safetensors header becomes a problem and safe=False."""
    path = write_raw_safetensors(tmp_path / "bad.safetensors", header, data, length)
    scan = scan_path(path)
    assert scan.format == "safetensors" and not scan.safe
    assert expected in {p.code for p in scan.problems_all()}


def test_a_gap_between_tensors_is_a_warning_only(tmp_path):
    """Unused bytes between tensors are odd but harmless: reported, still safe."""
    header = json.dumps({"a": good_entry(0, 16), "b": good_entry(32, 48)}).encode()
    path = write_raw_safetensors(tmp_path / "gap.safetensors", header, b"\x00" * 48)
    scan = scan_path(path)
    assert scan.safe and "safetensors_gap" in {p.code for p in scan.problems_all()}


def test_a_shard_index_naming_a_path_outside_its_folder_is_unsafe(tmp_path):
    """weight_map entries must be plain file names beside the index."""
    write_safetensors(tmp_path / "model-1.safetensors", {"w": torch.ones(2)})
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": "model-1.safetensors", "v": "../../etc/passwd"}}))
    scan = scan_path(index)
    assert scan.format == "safetensors_sharded" and not scan.safe
    assert "index_shard_outside_folder" in {p.code for p in scan.problems_all()}


def test_a_missing_shard_is_reported_without_making_the_files_unsafe(tmp_path):
    """A shard that is not there breaks loading, which is reported, but nothing hostile was seen."""
    write_safetensors(tmp_path / "model-1.safetensors", {"w": torch.ones(2)})
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": "model-1.safetensors", "v": "model-2.safetensors"}}))
    scan = scan_path(index)
    assert scan.safe and "index_missing_shard" in {p.code for p in scan.problems_all()}


def repoint_dcp_item(folder: Path, **changes) -> None:
    """Rewrite the first storage entry of a DCP .metadata we wrote ourselves."""
    meta = pickle.loads((folder / ".metadata").read_bytes())
    index, info = next(iter(meta.storage_data.items()))
    fields = {"relative_path": info.relative_path, "offset": info.offset, "length": info.length, **changes}
    meta.storage_data[index] = type(info)(fields["relative_path"], fields["offset"], fields["length"], None)
    (folder / ".metadata").write_bytes(pickle.dumps(meta))


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"relative_path": "../../elsewhere.distcp"}, "dcp_item_outside_folder"),
        ({"offset": 10**9}, "dcp_item_beyond_file"),
    ],
)
def test_dcp_items_pointing_outside_their_file_or_folder_are_refused(tmp_path, changes, expected):
    """A DCP item must live inside a .distcp file of the checkpoint folder."""
    folder = tmp_path / "dcp"
    dcp_save({"model": TinyNet().state_dict(), "epoch": 1}, folder)
    repoint_dcp_item(folder, **changes)
    scan = scan_path(folder)
    assert scan.format == "dcp" and not scan.safe
    assert expected in {p.code for p in scan.problems_all()}


@pytest.mark.parametrize(
    ("content", "expected"),
    [(b"", "empty_file"), (b"\x00\x01\x02 random bytes, not a checkpoint", "unknown_format")],
)
def test_files_that_are_no_checkpoint_format_cannot_be_called_safe(tmp_path, content, expected):
    """An unrecognised format is 'cannot verify', not 'safe'."""
    path = tmp_path / "weights.bin"
    path.write_bytes(content)
    scan = scan_path(path)
    assert not scan.safe and expected in {p.code for p in scan.problems_all()}


def test_a_legacy_tar_checkpoint_is_refused(tmp_path):
    """torch < 0.4 tar archives are reported instead of scanned."""
    path = tmp_path / "old.pt"
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("pickle")
        payload = pickle.dumps({"a": 1})
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    scan = scan_path(path)
    assert scan.format == "legacy_tar" and not scan.safe


def test_a_folder_without_checkpoint_files_verifies_nothing(tmp_path):
    """An empty folder is not 'safe': there was nothing to verify."""
    (tmp_path / "notes.txt").write_text("hello")
    scan = scan_path(tmp_path)
    assert not scan.safe and "no_checkpoint_files" in {p.code for p in scan.problems_all()}


def test_a_link_leaving_the_checkpoint_folder_is_not_followed(tmp_path):
    """A shard that is a symlink to a file elsewhere is reported and skipped."""
    outside = tmp_path / "outside.safetensors"
    write_safetensors(outside, {"w": torch.ones(2)})
    folder = tmp_path / "ckpt"
    folder.mkdir()
    write_safetensors(folder / "model.safetensors", {"w": torch.ones(2)})
    (folder / "extra.safetensors").symlink_to(outside)
    scan = scan_path(folder)
    assert not scan.safe and "link_outside_folder" in {p.code for p in scan.problems_all()}
    assert [f.name for f in scan.files] == ["model.safetensors"]


def test_a_data_pkl_torch_would_read_differently_is_a_parser_disagreement(tmp_path):
    """The loader compares torch's own zip reader with what the scan read; any difference stops loading."""
    from torch_skills.checkpoint.load import cross_check_zip

    path = tmp_path / "m.pt"
    path.write_bytes(torch_zip_bytes())
    file = scan_path(path).files[0]
    assert cross_check_zip(file) == []
    file.zip.data_pkl_sha256 = "0" * 64  # what a scanner-targeted archive would make zipfile return
    assert [p.code for p in cross_check_zip(file)] == ["zip_parser_disagreement"]


HEADER_LAYOUTS = {
    "compact": b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I64","shape":[],"data_offsets":[8,16]}}',
    "spaced_with_metadata": b'{"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [2, 1], "data_offsets": [0, 8]}}',
    "escaped_and_unicode_names": '{"a\\"q\\u00e9": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "\u00fc": {"dtype": "U8", "shape": [8], "data_offsets": [8, 16]}}'.encode(),
    "metadata_last": b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "__metadata__": {"k": "v"}}',
    "other_key_order": b'{"a": {"shape": [2], "dtype": "F32", "data_offsets": [0, 8]}}',
    "duplicate_name": b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}',
    "lying_size": b'{"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}',
    "leading_zero": b'{"a": {"dtype": "F32", "shape": [02], "data_offsets": [0, 8]}}',
    "offsets_out_of_header_order": b'{"b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}, "a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}}',
    "zero_size_tensors": b'{"e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [8, 8]}, "a": {"dtype": "U8", "shape": [2, 4], "data_offsets": [0, 8]}, "s": {"dtype": "BOOL", "shape": [], "data_offsets": [8, 9]}}',
    "gap_and_overlap": b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [6, 14]}}',
    "vertical_tab_as_space": b'{"a":\x0b{"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}',
    "no_comma_between_entries": b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]} "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}',
    "trailing_comma": b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},}',
    "comma_after_metadata_only": b'{"__metadata__": {"k": "v"}, }',
    "key_twice_in_metadata": b'{"__metadata__": {"k": "v", "k": "w"}, "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}',
    "tensor_named_metadata": b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "__metadata__": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}',
    "bad_escape_in_name": b'{"a\\x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}',
    "unknown_dtype": b'{"a": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}}',
    "offsets_past_the_data": b'{"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}}',
}
FAST_LAYOUTS = (
    "compact",
    "spaced_with_metadata",
    "escaped_and_unicode_names",
    "lying_size",
    "offsets_out_of_header_order",
    "zero_size_tensors",
    "gap_and_overlap",
    "unknown_dtype",
    "offsets_past_the_data",
)


@pytest.mark.parametrize("layout", sorted(HEADER_LAYOUTS))
def test_the_fast_header_path_agrees_with_the_json_parser(tmp_path, monkeypatch, layout):
    """Every layout gives the same tensors and problems whether or not the fast pattern path takes it."""
    from torch_skills.checkpoint import safetensors_format as sf

    raw = HEADER_LAYOUTS[layout]
    raw += b" " * (-len(raw) % 8)
    path = tmp_path / "h.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(16))
    if layout in FAST_LAYOUTS:
        assert sf._fast_header(raw) is not None  # the usual layouts do take the fast path
    fast = sf.read_safetensors_header(path)
    monkeypatch.setattr(sf, "_fast_header", lambda raw: None)
    slow = sf.read_safetensors_header(path)
    as_tuples = lambda h: [(t.name, t.dtype, t.shape, t.begin, t.end) for t in h.tensors]  # noqa: E731
    assert as_tuples(fast) == as_tuples(slow)
    assert [(p.code, p.source, p.message) for p in fast.problems] == [
        (p.code, p.source, p.message) for p in slow.problems
    ]
    assert fast.metadata == slow.metadata
    assert fast.tensor_names == [t.name for t in fast.tensors]
