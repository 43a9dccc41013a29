"""Samples where a container is read differently by its loader and by a naive scanner (issue 25).

Use `build_parity_corpus(folder)` -> (malicious, benign), each a list of (family, label, path),
as bench/scan_compare.py does. Every malicious sample runs `posix.system("true")` when loaded the
way its loader loads it (np.load(allow_pickle=True), torch.load(weights_only=False),
torch.distributed.checkpoint.load, torch.export.load, joblib.load, pickle.load); the builders
(tests/fixtures/container_payloads.py, joblib_format.py) are the ones
tests/test_checkpoint_loader_parity.py and tests/test_checkpoint_false_alarms.py check against
those loaders' own readers. Nothing here is unpickled.
"""

from __future__ import annotations

import io
import pickle
import tarfile
import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch

from tests.fixtures.checkpoint_corpus import dcp_save, dcp_with_item
from tests.fixtures.checkpoint_models import TinyNet
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
from tests.fixtures.joblib_format import joblib_bytes, scikit_like

Sample = tuple[str, str, Path]


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _malicious(root: Path) -> list[Sample]:
    out: list[Sample] = []
    for i, descr in enumerate(OBJECT_SPELLINGS):
        out.append(
            ("npy object dtype spellings", f"npy_{descr}", _write(root / f"npy{i}.npy", npy_bytes(descr)))
        )
    out.append(
        ("npy object dtype spellings", "npy_v3_object", _write(root / "v3.npy", npy_bytes("object", (3, 0))))
    )
    out.append(
        ("npy object dtype spellings", "npy_py2_long", _write(root / "l.npy", npy_bytes("|O", shape="(1L,)")))
    )
    npz = io.BytesIO()
    with zipfile.ZipFile(npz, "w") as z:
        z.writestr("x.npy", npy_bytes("f4,O", (3, 0)))
    out.append(("npy object dtype spellings", "npz_f4_O", _write(root / "a.npz", npz.getvalue())))
    upper = break_crc(
        torch_zip({"archive/DATA.PKL": PAYLOAD, "archive/version": b"3\n"}), b"archive/DATA.PKL"
    )
    out.append(("torch zip read as torch reads it", "upper_case_bad_crc", _write(root / "upper.pt", upper)))
    local = rename_local(
        torch_zip({"archive/data.pkl": PAYLOAD, "archive/version": b"3\n"}),
        b"archive/data.pkl",
        b"archive/xata.pkl",
    )
    out.append(("torch zip read as torch reads it", "local_name_mismatch", _write(root / "local.pt", local)))
    name = b"archive/data/constants/tensor_constant_0"
    pt2 = torch_zip(
        {"archive/archive_format": b"pt2", name.decode(): PAYLOAD, "archive/byteorder": b"little"}
    )
    out.append(
        (
            "torch zip read as torch reads it",
            "pt2_constant_local_name",
            _write(root / "m.pt2", rename_local(pt2, name, name[:-1] + b"9")),
        )
    )
    out.append(
        ("torch zip read as torch reads it", "dcp_bytes_item_upper_crc", dcp_with_item(root / "dcp", upper))
    )
    legacy = tar_bytes(
        {
            "sys_info": b"N.",
            "pickle": b"N.",
            "storages": pickle.dumps(1, protocol=2) + PAYLOAD,
            "tensors": b"K\x00.",
            "README": b"hi",
        }
    )
    out.append(("legacy tar", "legacy_tar_extra_member", _write(root / "old.pt", legacy)))
    v7 = v7_member(b"N.", b"x") + v7_member(b"storages", PAYLOAD) + b"\0" * 1024
    out.append(("legacy tar", "v7_tar_pickle_name", _write(root / "v7.pt", v7)))
    obj = joblib_bytes({"x": np.array([1, None], dtype=object)}, raw_object=PAYLOAD)
    out.append(("joblib", "joblib_object_array_payload", _write(root / "obj.joblib", obj)))
    out.append(
        (
            "joblib",
            "joblib_payload_after_array",
            _write(root / "after.joblib", joblib_bytes({"w": np.ones(4)}) + PAYLOAD),
        )
    )
    surrogate = "x\ud800y".encode("utf-8", "surrogatepass")  # posix.system('id'), then os.<surrogate>
    odd = b"\x80\x04\x8c\x05posix\x8c\x06system\x93\x8c\x02id\x85R0\x8c\x02os\x8c" + bytes([len(surrogate)])
    out.append(
        ("odd names", "surrogate_global", _write(root / "surrogate.pkl", odd + surrogate + b"\x930N."))
    )
    return out


def _benign(root: Path) -> list[Sample]:
    out: list[Sample] = []
    raw = joblib_bytes(scikit_like())
    out.append(("parity benign", "joblib_arrays", _write(root / "model.joblib", raw)))
    out.append(("parity benign", "joblib_arrays_zlib", _write(root / "packed.joblib", zlib.compress(raw, 3))))
    buf = io.BytesIO()
    np.save(buf, np.arange(6, dtype=np.float32))
    out.append(("parity benign", "npy_float", _write(root / "f.npy", buf.getvalue())))
    buf = io.BytesIO()
    np.savez(buf, a=np.arange(3), b=np.array(["x", "y"]))
    out.append(("parity benign", "npz_plain", _write(root / "p.npz", buf.getvalue())))
    folder = root / "dcp_ok"
    dcp_save({"model": TinyNet().state_dict(), "epoch": 3}, folder)
    out.append(("parity benign", "dcp_with_counter", folder))
    tarred = io.BytesIO()
    with tarfile.open(fileobj=tarred, mode="w:") as tar:
        data = io.BytesIO()
        torch.save({"w": torch.ones(2)}, data)
        info = tarfile.TarInfo("weights.pt")
        info.size = len(data.getvalue())
        tar.addfile(info, io.BytesIO(data.getvalue()))
    out.append(("parity benign", "tar_of_a_checkpoint", _write(root / "packed.tar", tarred.getvalue())))
    return out


def build_parity_corpus(root: Path) -> tuple[list[Sample], list[Sample]]:
    """(malicious, benign) samples under `root`."""
    return _malicious(root / "malicious"), _benign(root / "benign")
