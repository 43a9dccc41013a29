"""Samples for bench/scan_compare.py: attack families from public scanner test suites, bypasses, real benign files.

Use `build_public_corpus(folder) -> (malicious, benign)`, each a list of `(family, name, path)`.

The malicious families are regenerated here from what the published test suites of picklescan
(mmaitre314/picklescan, tests/test_scanner.py and its GHSA regression files), fickling
(trailofbits/fickling, tests) and modelscan (protectai/modelscan, tests) exercise: the callable
each one reaches and the pickle construction it uses, written anew as opcode bytes or
`__reduce__` payloads, each named by family. No file of theirs is copied, and no payload here is
ever loaded: the arguments are harmless strings, since the scanners only read bytes.
Known bypasses come next (FRAME trick, zips without data.pkl, .npz object arrays, .pt2 nested
archives, joblib beside Hugging Face weights). Benign files are written by the real libraries
when they are installed (torch, numpy, safetensors, transformers, accelerate, DCP), plus the
dict layouts timm and Lightning save.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import io
import json
import os
import pathlib
import pickle
import random
import struct
import sys
import tarfile
import warnings
import zipfile
import zlib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from tests.fixtures.malicious.payloads import (  # noqa: E402 - opcode helpers of the test corpus
    PROTO2,
    PROTO4,
    STOP,
    _write_pt2,
    call,
    frame_trick,
    glob,
    short,
    text,
)

Sample = tuple[str, str, Path]


def _call_global(module: str, name: str, *args: bytes, proto: bytes = PROTO2) -> bytes:
    return proto + glob(module, name) + call(*args) + STOP


def _stack_global_call(module: str, name: str, arg: str) -> bytes:
    return PROTO4 + short(module) + short(name) + b"\x93" + short(arg) + b"\x85R" + STOP


class _Reduce:
    def __init__(self, func, args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _torch_zip(obj) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


# (family, name, module, callable): each pickles to module.callable("true") via GLOBAL + REDUCE
_CALLABLES = [
    ("picklescan: builtins", "eval", "builtins", "eval"),
    ("picklescan: builtins", "exec_py2_name", "__builtin__", "exec"),
    ("picklescan: os", "os_system", "os", "system"),
    ("picklescan: os", "posix_system", "posix", "system"),
    ("picklescan: network", "http_client_connection", "http.client", "HTTPSConnection"),
    ("picklescan: network", "requests_get", "requests.api", "get"),
    ("picklescan: network", "aiohttp_session", "aiohttp.client", "ClientSession"),
    ("picklescan: network", "socket_create_connection", "socket", "create_connection"),
    ("picklescan: subprocess", "subprocess_run", "subprocess", "run"),
    ("picklescan: sys", "sys_exit", "sys", "exit"),
    ("picklescan: nested pickle", "pickle_loads", "pickle", "loads"),
    ("picklescan: nested pickle", "cpickle_loads_py2", "cPickle", "loads"),
    ("picklescan: runpy", "runpy_run_code", "runpy", "_run_code"),
    ("picklescan: debugger", "bdb_run", "bdb", "Bdb.run"),
    ("picklescan: torch internals", "inductor_compile_file", "torch._inductor.codecache", "compile_file"),
    ("picklescan: pager", "pydoc_pipepager", "pydoc", "pipepager"),
    ("picklescan: venv", "venv_create", "venv", "create"),
    ("picklescan: pip", "pip_main", "pip", "main"),
    ("picklescan GHSA: stdlib gadgets", "pydoc_locate", "pydoc", "locate"),
    ("picklescan GHSA: stdlib gadgets", "pyrepl_pager", "_pyrepl.pager", "pipe_pager"),
    ("picklescan GHSA: stdlib gadgets", "osx_support_read_output", "_osx_support", "_read_output"),
    ("picklescan GHSA: stdlib gadgets", "aix_support_read_cmd", "_aix_support", "_read_cmd_output"),
    ("picklescan GHSA: stdlib gadgets", "imaplib_stream", "imaplib", "IMAP4_stream"),
    ("picklescan GHSA: stdlib gadgets", "uuid_get_command_stdout", "uuid", "_get_command_stdout"),
    (
        "picklescan GHSA: stdlib gadgets",
        "test_support_script_helper",
        "test.support.script_helper",
        "assert_python_ok",
    ),
    ("picklescan GHSA: file writes", "logging_file_handler", "logging", "FileHandler"),
    ("picklescan GHSA: file writes", "io_fileio", "io", "FileIO"),
    ("picklescan GHSA: file writes", "distutils_write_file", "distutils.file_util", "write_file"),
    ("picklescan GHSA: stdlib gadgets", "code_interact", "code", "InteractiveInterpreter.runsource"),
    ("picklescan GHSA: stdlib gadgets", "cprofile_run", "cProfile", "run"),
    ("picklescan GHSA: stdlib gadgets", "timeit_timeit", "timeit", "timeit"),
    ("picklescan GHSA: stdlib gadgets", "trace_runctx", "trace", "Trace.runctx"),
    ("picklescan GHSA: stdlib gadgets", "ctypes_cdll", "ctypes", "CDLL"),
    ("picklescan GHSA: stdlib gadgets", "ensurepip_run_pip", "ensurepip", "_run_pip"),
    ("picklescan GHSA: stdlib gadgets", "platform_syscmd", "platform", "_syscmd_file"),
    (
        "picklescan GHSA: stdlib gadgets",
        "asyncio_subprocess",
        "asyncio.subprocess",
        "create_subprocess_shell",
    ),
    ("picklescan GHSA: numpy gadgets", "numpy_runstring", "numpy.testing._private.utils", "runstring"),
    ("fickling: unsafe imports", "builtins_getattr", "builtins", "getattr"),
    ("fickling: unsafe imports", "builtins_import", "builtins", "__import__"),
    ("fickling: unsafe imports", "builtins_compile", "builtins", "compile"),
    ("fickling: unsafe imports", "builtins_open", "builtins", "open"),
    ("fickling: torch", "torch_hub_load", "torch.hub", "load"),
    ("fickling: torch", "torch_jit_load", "torch.jit", "load"),
    ("modelscan: unsafe globals", "webbrowser_open", "webbrowser", "open"),
    ("modelscan: unsafe globals", "shutil_rmtree", "shutil", "rmtree"),
    ("modelscan: unsafe globals", "pty_spawn", "pty", "spawn"),
    ("modelscan: unsafe globals", "httplib_connection_py2", "httplib", "HTTPSConnection"),
    ("modelscan: unsafe globals", "operator_attrgetter", "operator", "attrgetter"),
    ("modelscan: unsafe globals", "functools_partial", "functools", "partial"),
]


def _malicious(root: Path) -> list[Sample]:
    out: list[Sample] = []

    def add(family: str, name: str, data: bytes | None = None, suffix: str = ".pkl") -> Path:
        path = root / f"{name}{suffix}"
        if data is not None:
            path.write_bytes(data)
        out.append((family, name, path))
        return path

    for family, name, module, attr in _CALLABLES:
        add(family, name, _call_global(module, attr, text("true")))
    for proto in (0, 3, 4):  # picklescan tests every protocol's spelling of the same payloads
        add(
            "picklescan: protocols",
            f"reduce_eval_p{proto}",
            pickle.dumps(_Reduce(eval, ("1",)), protocol=proto),
        )
        add(
            "picklescan: protocols",
            f"reduce_system_p{proto}",
            pickle.dumps(_Reduce(os.system, ("true",)), protocol=proto),
        )
    add(
        "picklescan: sour pickles",
        "globals_compile_eval_chain",
        b"c__builtin__\nglobals\n(tRp100\n0c__builtin__\ncompile\n(S'x=1'\nS''\nS'exec'\ntRp101\n0"
        b"c__builtin__\neval\n(g101\ng100\ntRp102\n0g102\n.",
    )
    add("picklescan: unusual opcodes", "inst_exec", b"(S'x=1'\ni__builtin__\nexec\n.")
    memo_trick = b"Vos\np2\n0Vsystem\np3\n0Vtorch\np0\n0VLongStorage\np1\n0g2\ng3\n\x93(Vtrue\ntR."
    add("picklescan: memo tricks", "text_memo_stack_global", memo_trick)
    add("picklescan: broken pickles", "trailing_invalid_bytes", memo_trick + b"\n\n\t\t")
    add("picklescan: broken pickles", "no_stop", b"cbuiltins\nexec\n(X\x03\x00\x00\x00x=1tRX.")
    add(
        "picklescan: concatenated",
        "benign_then_payload",
        pickle.dumps(["a"]) + pickle.dumps(_Reduce(os.system, ("true",))),
    )
    add(
        "picklescan: memo tricks",
        "attrgetter_import_chain",
        PROTO4
        + short("operator")
        + b"\x94"
        + short("attrgetter")
        + b"\x94\x93\x94"
        + short("system")
        + b"\x94\x85\x94R\x94"
        + short("builtins")
        + b"\x94"
        + short("__import__")
        + b"\x94\x93\x94"
        + short("os")
        + b"\x94\x85\x94R\x94\x85\x94R\x94"
        + short("true")
        + b"\x94\x85\x94R\x94.",
    )
    add(
        "picklescan: nested torch.load",
        "partial_torch_load",
        PROTO2 + glob("functools", "partial") + call(glob("torch", "load"), text("other.bin")) + b")R.",
    )
    add(
        "picklescan: zips",
        "zip_data_pkl",
        _zip({"data.pkl": pickle.dumps(_Reduce(eval, ("1",)), protocol=4)}),
        ".zip",
    )
    add(
        "picklescan: zips",
        "zip_wrong_extension",
        _zip({"data.txt": pickle.dumps(_Reduce(eval, ("1",)), protocol=4)}),
        ".zip",
    )
    bad_cd = _zip({"data.pkl": pickle.dumps(_Reduce(eval, ("1",)), protocol=4)}).replace(
        b"data.pkl", b"datap.kl", 1
    )
    add("picklescan: zips", "zip_renamed_local_header", bad_cd, ".zip")
    add("picklescan: archives", "seven_zip", b"7z\xbc\xaf\x27\x1c\x00\x04" + bytes(32), ".7z")
    add(
        "picklescan: torch",
        "pytorch_magic_bypass",
        pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)
        + pickle.dumps(_Reduce(os.system, ("true",)), protocol=2),
        ".pt",
    )
    import numpy as np

    arr = np.empty(1, dtype=object)
    arr[0] = _Reduce(os.system, ("true",))
    p = root / "npy_object_payload.npy"
    np.save(p, arr, allow_pickle=True)
    out.append(("picklescan/modelscan: numpy", "npy_object_payload", p))
    p = root / "npz_object_payload.npz"
    np.savez_compressed(p, w=np.ones(2), meta=arr)
    out.append(("bypass: npz object array", "npz_object_payload", p))
    try:
        p = root / "torch_zip_payload.pt"
        p.write_bytes(_torch_zip({"w": __import__("torch").ones(2), "cfg": _Reduce(os.system, ("true",))}))
        out.append(("modelscan: pytorch", "torch_zip_payload", p))
        # fickling's injection: a call run first, its result popped, then the original object
        add(
            "fickling: injection",
            "payload_then_original",
            PROTO2
            + glob("os", "system")
            + call(text("true"))
            + b"0"
            + pickle.dumps({"w": 1}, protocol=2)[2:],
        )
        add(
            "bypass: FRAME trick",
            "frame_trick",
            frame_trick(glob("os", "system") + call(text("true")), b"N" + STOP),
        )
        state = zipfile.ZipFile(io.BytesIO(_torch_zip({"w": __import__("torch").ones(2)})))
        zbuf = io.BytesIO()
        with zipfile.ZipFile(zbuf, "w") as z:
            for info in state.infolist():
                data = state.read(info)
                if info.filename.endswith("/data.pkl"):
                    data = frame_trick(glob("os", "system") + call(text("true")), data[2:])
                z.writestr(info.filename, data)
        add("bypass: FRAME trick", "frame_trick_torch_zip", zbuf.getvalue(), ".pt")
        p = root / "pt2_sample_inputs.pt2"
        _write_pt2(p, sample_inputs=_torch_zip(((_Reduce(os.system, ("true",)),), {})))
        out.append(("bypass: .pt2 nested archive", "pt2_sample_inputs", p))
    except ImportError:
        pass
    add(
        "bypass: zip without data.pkl",
        "zip_protocol0_member",
        _zip({"w/blob": pickle.dumps(_Reduce(os.system, ("true",)), protocol=0)}),
        ".zip",
    )
    add(
        "bypass: compressed joblib",
        "joblib_zlib",
        zlib.compress(pickle.dumps(_Reduce(os.system, ("true",)), protocol=4)),
        ".joblib",
    )
    add(
        "bypass: compressed pickle",
        "pickle_gzip",
        gzip.compress(pickle.dumps(_Reduce(os.system, ("true",)))),
        ".pkl.gz",
    )
    tar_path = root / "tar_member.tar"
    with tarfile.open(tar_path, "w") as tar:
        data = pickle.dumps(_Reduce(os.system, ("true",)), protocol=2)
        info = tarfile.TarInfo("model/extra.bin")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    out.append(("bypass: tar member", "tar_member", tar_path))
    hf = root / "hf_folder_joblib"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    _safetensors(hf / "model.safetensors")
    (hf / "preprocessor.joblib").write_bytes(pickle.dumps(_Reduce(os.system, ("true",)), protocol=4))
    out.append(("bypass: joblib in a HF folder", "hf_folder_joblib", hf))
    return out


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def _safetensors(path: Path) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))


def _benign(root: Path) -> list[Sample]:
    out: list[Sample] = []

    def add(family: str, name: str, path: Path) -> None:
        out.append((family, name, path))

    import numpy as np

    np.save(root / "float32.npy", np.ones((4, 4), dtype=np.float32))
    add("numpy", "float32_npy", root / "float32.npy")
    np.savez(root / "arrays.npz", a=np.arange(4), b=np.zeros(3))
    add("numpy", "int_arrays_npz", root / "arrays.npz")
    x = np.empty((2, 2), dtype=object)
    x[:] = [(1, 2), (3, 4)]
    np.save(root / "object_tuples.npy", x, allow_pickle=True)
    add("numpy", "object_array_of_tuples", root / "object_tuples.npy")
    (root / "numpy_pickle.pkl").write_bytes(pickle.dumps({"a": np.ones(3), "b": np.float64(1.0)}, protocol=5))
    add("numpy", "pickled_arrays_p5", root / "numpy_pickle.pkl")
    for proto in (0, 3, 4):
        (root / f"plain_p{proto}.pkl").write_bytes(
            pickle.dumps({"a": [1, 2], "b": ("x", 1.5)}, protocol=proto)
        )
        add("pickle", f"plain_data_p{proto}", root / f"plain_p{proto}.pkl")
    try:
        import torch
    except ImportError:
        return out
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(net.parameters())
    net(torch.randn(2, 8)).sum().backward()
    opt.step()
    torch.save(net.state_dict(), root / "state_dict.pt")
    add("torch", "state_dict", root / "state_dict.pt")
    torch.save(net.state_dict(), root / "legacy.pt", _use_new_zipfile_serialization=False)
    add("torch", "legacy_format", root / "legacy.pt")
    torch.save(
        {
            "model": net.state_dict(),
            "optimizer": opt.state_dict(),
            "epoch": 3,
            "rng": {
                "torch": torch.get_rng_state(),
                "numpy": np.random.get_state(),
                "python": random.getstate(),
            },
        },
        root / "training.pt",
    )
    add("torch", "training_checkpoint", root / "training.pt")
    args = argparse.Namespace(model="resnet50", lr=0.1, epochs=90)
    torch.save(
        {
            "epoch": 4,
            "arch": "resnet50",
            "state_dict": net.state_dict(),
            "optimizer": opt.state_dict(),
            "version": 2,
            "args": args,
            "metric": 0.7,
        },
        root / "timm_train.pth.tar",
    )
    add("timm layout", "timm_train_checkpoint", root / "timm_train.pth.tar")
    torch.save(
        {
            "epoch": 1,
            "global_step": 10,
            "pytorch-lightning_version": "2.4.0",
            "state_dict": {f"model.{k}": v for k, v in net.state_dict().items()},
            "optimizer_states": [opt.state_dict()],
            "hyper_parameters": args,
            "callbacks": {
                "ModelCheckpoint": {
                    "best_model_score": torch.tensor(0.2),
                    "dirpath": pathlib.PurePosixPath("/ckpt"),
                }
            },
            "saved": datetime.datetime(2024, 1, 1),
        },
        root / "lightning.ckpt",
    )
    add("Lightning layout", "lightning_namespace_hparams", root / "lightning.ckpt")
    try:  # Lightning/Hydra runs keep OmegaConf hyper-parameters in the checkpoint
        from omegaconf import OmegaConf

        hp = OmegaConf.create({"model": {"hidden": 16, "layers": [1, 2]}, "lr": 1e-3, "name": "run"})
        torch.save(
            {"epoch": 1, "state_dict": net.state_dict(), "hyper_parameters": hp}, root / "omegaconf.ckpt"
        )
        add("Lightning layout", "lightning_omegaconf_hparams", root / "omegaconf.ckpt")
    except ImportError:
        pass
    try:
        from safetensors.torch import save_file

        save_file(dict(net.state_dict()), root / "model.safetensors", metadata={"format": "pt"})
        add("safetensors", "safetensors_library_file", root / "model.safetensors")
    except ImportError:
        pass
    try:
        import torch.distributed.checkpoint as dcp

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(
                {"model": net.state_dict(), "optimizer": opt.state_dict(), "epoch": 3},
                checkpoint_id=str(root / "dcp"),
            )
        add("torch DCP", "dcp_folder", root / "dcp")
    except Exception:  # noqa: BLE001 - optional in minimal torch builds
        pass
    try:
        from transformers import BertConfig, BertModel, TrainingArguments

        model = BertModel(
            BertConfig(
                hidden_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=37,
                vocab_size=99,
            )
        )
        model.save_pretrained(root / "hf_model")
        add("transformers", "save_pretrained_safetensors", root / "hf_model")
        model.save_pretrained(root / "hf_model_bin", safe_serialization=False)
        add("transformers", "save_pretrained_pytorch_bin", root / "hf_model_bin")
        ckpt = root / "hf_trainer" / "checkpoint-10"
        ckpt.mkdir(parents=True)
        model.save_pretrained(ckpt)
        torch.save(opt.state_dict(), ckpt / "optimizer.pt")
        torch.save(TrainingArguments(output_dir=str(root / "out"), report_to=[]), ckpt / "training_args.bin")
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 10}))
        add("transformers", "trainer_checkpoint_folder", ckpt)
    except Exception:  # noqa: BLE001 - transformers missing or unable to build here
        pass
    try:
        from accelerate import Accelerator

        acc = Accelerator(cpu=True)
        m, o = acc.prepare(torch.nn.Linear(4, 4), torch.optim.SGD(torch.nn.Linear(4, 4).parameters(), lr=0.1))
        acc.save_state(str(root / "accelerate_state"))
        add("accelerate", "save_state_folder", root / "accelerate_state")
    except Exception:  # noqa: BLE001 - accelerate missing or its optional deps missing
        pass
    return out


def build_public_corpus(root: Path) -> tuple[list[Sample], list[Sample]]:
    bad, good = root / "malicious", root / "benign"
    bad.mkdir(parents=True, exist_ok=True)
    good.mkdir(parents=True, exist_ok=True)
    return _malicious(bad), _benign(good)
