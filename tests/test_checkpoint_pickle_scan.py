"""The static pickle scanner: allowlist, opcode coverage, name resolution, bounds."""

from __future__ import annotations

import io
import os
import pickle
import pickletools
import struct
from collections import OrderedDict

import numpy as np
import pytest
import torch

from tests.fixtures.checkpoint_models import TinyNet
from tests.fixtures.malicious.payloads import (
    BUILD,
    EMPTY_DICT,
    MEMOIZE,
    POP,
    PROTO2,
    PROTO4,
    REDUCE,
    STACK_GLOBAL,
    STOP,
    TUPLE1,
    Payload,
    binget,
    call,
    glob,
    short,
    text,
)
from torch_skills.checkpoint.allowlist import NUMPY_DATA, TORCH_WEIGHTS_ONLY, Policy
from torch_skills.checkpoint.pickle_scan import HANDLED_OPCODES, ScanLimits, scan_pickle


def torch_data_pkl(obj, protocol: int = 2) -> bytes:
    """The data.pkl torch.save writes for obj."""
    import zipfile

    buf = io.BytesIO()
    torch.save(obj, buf, pickle_protocol=protocol)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))


def test_the_torch_tier_is_exactly_what_weights_only_allows_by_default():
    """Our torch tier equals torch 2.13's _get_allowed_globals() and never exceeds the installed torch's."""
    from torch._weights_only_unpickler import _get_allowed_globals

    installed = set(_get_allowed_globals())
    assert installed >= TORCH_WEIGHTS_ONLY, sorted(TORCH_WEIGHTS_ONLY - installed)
    if torch.__version__.startswith("2.13."):
        assert installed == TORCH_WEIGHTS_ONLY, sorted(installed - TORCH_WEIGHTS_ONLY)


def test_numpy_tier_names_only_array_building_globals_that_exist():
    """Every numpy name is importable in numpy 2 or named for numpy 1 (core -> _core)."""
    import importlib

    for name in NUMPY_DATA:
        module, _, attr = name.rpartition(".")
        if module.startswith("numpy.core"):
            module = module.replace("numpy.core", "numpy._core")
        assert hasattr(importlib.import_module(module), attr), name


def test_every_pickletools_opcode_is_modelled():
    """Protocols 0-5 have 68 opcodes in Python 3.11; each has a branch in the symbolic machine."""
    assert {op.name for op in pickletools.opcodes} == HANDLED_OPCODES


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_a_torch_state_dict_at_any_protocol_is_safe(protocol):
    """torch.save of a state dict with Parameters and buffers needs only allowlisted globals."""
    scan = scan_pickle(torch_data_pkl(TinyNet().state_dict(), protocol), "data.pkl")
    assert scan.safe and scan.unsafe_total == 0
    assert "torch._utils._rebuild_tensor_v2" in scan.globals_used
    assert {pid[0] for pid in scan.persistent_ids} == {"storage"}


@pytest.mark.parametrize("protocol", range(6))
def test_plain_python_data_at_every_protocol_is_safe(protocol):
    """Dicts, lists, tuples, sets, bytes, floats and big ints need no global outside the allowlist."""
    data = {"a": [1, 2.5, None, True], "b": (b"x" * 300, "y" * 300), "c": {1, 2}, "d": 2**80}
    scan = scan_pickle(pickle.dumps(data, protocol=protocol), "plain.pkl")
    assert scan.safe and scan.pickles == 1


def test_a_reduce_payload_is_reported_with_its_offset_and_call_site():
    """posix.system is unsafe; the offset points at its GLOBAL opcode and called_at at the REDUCE."""
    data = pickle.dumps(Payload(os.system, ("true",)), protocol=2)
    scan = scan_pickle(data, "evil.pkl")
    [ref] = scan.unsafe
    assert ref.qualified == "posix.system" and ref.risk == "code_execution"
    assert data[ref.offset : ref.offset + 1] == b"c"
    assert data[ref.called_at : ref.called_at + 1] == b"R"


def test_stack_global_arguments_from_the_memo_resolve_to_the_real_name():
    """Strings memoized, popped, and fetched back with BINGET still resolve to os.system."""
    data = PROTO4 + short("os") + MEMOIZE + POP + short("system") + MEMOIZE + POP
    data += binget(0) + binget(1) + STACK_GLOBAL + short("true") + TUPLE1 + REDUCE + STOP
    [ref] = scan_pickle(data, "memo.pkl").unsafe
    assert ref.qualified == "os.system" and ref.opcode == "STACK_GLOBAL"


def test_an_overwritten_memo_slot_resolves_to_its_latest_value():
    """A slot first holding 'collections' then 'os' gives os.system, not collections.system."""
    data = PROTO4 + short("collections") + b"q\x00" + POP + short("os") + b"q\x00" + POP
    data += (
        short("system")
        + b"q\x01"
        + POP
        + binget(0)
        + binget(1)
        + STACK_GLOBAL
        + short("x")
        + TUPLE1
        + REDUCE
        + STOP
    )
    [ref] = scan_pickle(data, "memo.pkl").unsafe
    assert ref.qualified == "os.system"


def test_a_module_name_computed_at_load_time_is_unresolvable():
    """STACK_GLOBAL on the result of a call cannot be checked, so it is unsafe with no name."""
    data = (
        PROTO4
        + glob("_operator", "add")
        + call(short("o"), short("s"))
        + short("system")
        + STACK_GLOBAL
        + STOP
    )
    scan = scan_pickle(data, "computed.pkl")
    unresolved = [u for u in scan.unsafe if u.qualified is None]
    assert unresolved and unresolved[0].opcode == "STACK_GLOBAL"


def test_python2_names_are_mapped_before_the_allowlist_check():
    """`__builtin__ set` is builtins.set (allowed); `__builtin__ eval` is builtins.eval (not)."""
    safe = scan_pickle(PROTO2 + glob("__builtin__", "set") + b")" + REDUCE + STOP, "a.pkl")
    evil = scan_pickle(PROTO2 + glob("__builtin__", "eval") + call(text("1")) + STOP, "b.pkl")
    assert safe.safe
    assert evil.unsafe[0].qualified == "builtins.eval" and evil.unsafe[0].raw == "__builtin__.eval"


def test_build_on_a_global_itself_is_unsafe():
    """BUILD whose target is a class (not an instance) would patch that class's attributes."""
    data = PROTO2 + glob("collections", "OrderedDict") + EMPTY_DICT + BUILD + STOP
    scan = scan_pickle(data, "patch.pkl")
    assert not scan.safe and scan.unsafe[0].opcode == "BUILD"


def test_a_payload_before_an_invalid_opcode_is_still_reported():
    """Broken-then-wrapped: the scan stops at the bad byte but keeps what came before; never safe."""
    data = PROTO2 + glob("os", "system") + call(text("true")) + b"\xff junk"
    scan = scan_pickle(data, "broken.pkl")
    assert not scan.complete and not scan.safe
    assert scan.unsafe[0].qualified == "os.system"
    assert "unknown opcode 0xff" in scan.error and scan.error_offset == data.index(b"\xff")


def test_a_pickle_without_stop_is_incomplete():
    """A truncated stream cannot be called safe even when nothing unsafe was seen."""
    scan = scan_pickle(pickle.dumps([1, 2, 3], protocol=2)[:-1], "cut.pkl")
    assert not scan.complete and not scan.safe and "without a STOP" in scan.error


def test_a_second_pickle_after_the_first_is_scanned_too():
    """Concatenated pickles: the harmless first one does not hide the second."""
    data = pickle.dumps({"ok": 1}, protocol=2) + pickle.dumps(Payload(os.system, ("true",)), protocol=2)
    scan = scan_pickle(data, "two.pkl")
    assert scan.pickles == 2 and scan.unsafe[0].qualified == "posix.system"


def test_trailing_garbage_after_a_safe_pickle_is_only_a_warning():
    """Bytes no loader reads are reported, but they do not make a safe pickle unsafe."""
    tail = b"\x00\x01not a pickle"
    scan = scan_pickle(pickle.dumps({"ok": 1}, protocol=2) + tail, "tail.pkl")
    assert scan.safe and scan.trailing_bytes == len(tail) and scan.trailing_error


def test_a_pickle_inside_pickle_loads_is_scanned():
    """The bytes handed to pickle.loads are disassembled and their payload named."""
    inner = pickle.dumps(Payload(os.system, ("true",)), protocol=2)
    data = PROTO2 + glob("pickle", "loads") + call(b"C" + bytes([len(inner)]) + inner) + STOP
    names = {u.qualified for u in scan_pickle(data, "outer.pkl").unsafe}
    assert names == {"pickle.loads", "posix.system"}


def test_deep_nesting_stops_at_the_depth_bound():
    """A million nested MARKs end the scan at max_depth instead of exhausting memory."""
    scan = scan_pickle(PROTO2 + b"(" * 1_000_000, "deep.pkl", limits=ScanLimits(max_depth=1000))
    assert scan.limit_hit and not scan.safe and "nested" in scan.error


def test_nested_containers_count_toward_the_depth_bound():
    """Lists nested 200 deep trip a bound of 100."""
    data = PROTO2 + b"]" * 200 + b"a" * 199 + STOP
    scan = scan_pickle(data, "lists.pkl", limits=ScanLimits(max_depth=100))
    assert scan.limit_hit and "nesting deeper than 100" in scan.error


def test_the_opcode_bound_ends_a_long_scan():
    """max_opcodes caps the work on an endless stream of harmless opcodes."""
    data = pickle.dumps(list(range(5000)), protocol=2)
    scan = scan_pickle(data, "long.pkl", limits=ScanLimits(max_opcodes=1000))
    assert scan.limit_hit and not scan.complete


def test_a_declared_length_beyond_the_data_is_malformed_without_reading_it():
    """BINBYTES8 claiming 2**60 bytes is refused by arithmetic, not by allocating."""
    data = PROTO4 + b"\x8e" + struct.pack("<Q", 2**60) + b"abc"
    scan = scan_pickle(data, "huge.pkl")
    assert not scan.complete and "declares 1152921504606846976 bytes" in scan.error


def test_large_byte_arguments_are_skipped_not_copied():
    """A 3 MiB bytes value scans (as an opaque value) with a 1 MiB inline limit."""
    data = pickle.dumps({"blob": b"\x00" * (3 << 20)}, protocol=4)
    scan = scan_pickle(data, "blob.pkl", limits=ScanLimits(inline_arg_bytes=1 << 20))
    assert scan.safe


def test_numpy_data_is_allowed_only_with_the_numpy_tier():
    """numpy's _reconstruct/dtype are safe by default and unsafe with Policy(numpy=False)."""
    data = torch_data_pkl({"a": np.arange(3)})
    assert scan_pickle(data, "np.pkl").safe
    strict = scan_pickle(data, "np.pkl", Policy(numpy=False))
    assert {u.qualified for u in strict.unsafe} >= {"numpy.ndarray", "numpy.dtype"}


def test_unknown_classes_are_unsafe_but_labelled_unknown_risk():
    """A user's own class is refused by weights_only; it is unsafe with risk 'unknown', not 'code execution'."""
    data = PROTO2 + glob("mypkg.config", "TrainConfig") + b")\x81" + EMPTY_DICT + BUILD + STOP
    scan = scan_pickle(data, "cfg.pkl")
    [ref] = [u for u in scan.unsafe if u.qualified == "mypkg.config.TrainConfig"]
    assert ref.risk == "unknown" and "weights_only" in ref.reason


def test_plain_data_classes_are_allowed_in_their_own_tier_and_labelled_data():
    """argparse.Namespace is in the data tier; with that tier off it is unsafe with risk 'data'."""
    import argparse

    data = pickle.dumps(argparse.Namespace(lr=0.1), protocol=2)
    assert scan_pickle(data, "args.pkl").globals_used == {"argparse.Namespace": "data"}
    scan = scan_pickle(data, "args.pkl", Policy(data_classes=False))
    [ref] = [u for u in scan.unsafe if u.qualified == "argparse.Namespace"]
    assert ref.risk == "data" and not scan.safe


@pytest.mark.parametrize(
    ("name", "risk"),
    [
        ("builtins.dict", "data"),
        ("builtins.int", "data"),
        ("builtins.len", "unknown"),
        ("builtins.eval", "code_execution"),
        ("builtins.getattr", "code_execution"),
        ("builtins.str.format", "code_execution"),
        ("posix.system", "code_execution"),
    ],
)
def test_risk_labels_say_what_a_global_can_do(name, risk):
    """builtins.dict/int are data, eval/getattr and dotted attribute walks run code, others are unknown."""
    from torch_skills.checkpoint.allowlist import risk_of

    assert risk_of(name) == risk


def test_ordered_dict_state_and_shared_storages_stay_safe():
    """OrderedDict BUILD (state_dict _metadata) and views of one storage use only allowed names."""
    base = torch.arange(10.0)
    scan = scan_pickle(torch_data_pkl(OrderedDict(a=base[:5], b=base[5:])), "views.pkl")
    assert scan.safe and len({pid[2] for pid in scan.persistent_ids}) == 1
