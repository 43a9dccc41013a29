"""Static pickle analysis: what a pickle would import and call, found without unpickling it.

Use:

    scan = scan_pickle(data, source="archive/data.pkl")      # data: bytes or an mmap
    scan.complete          # every pickle parsed up to its STOP
    scan.unsafe            # UnsafeRef(offset, opcode, module, name, reason, risk, called_at)
    scan.globals_used      # {"torch._utils._rebuild_tensor_v2": "torch", ...}
    scan.persistent_ids    # [("storage", "torch.FloatStorage", "0", "cpu", 12), ...]

How: the opcodes are walked with the opcode table of `pickletools` (the one `pickletools.genops`
uses, every protocol 0-5 opcode) while a symbolic copy of the unpickler's stack, mark stack and
memo is kept. So a STACK_GLOBAL whose module and name come back from the memo (BINGET,
LONG_BINGET, GET after MEMOIZE or PUT, even after the memo slot was overwritten) resolves to the
name the real unpickler would import, and one whose strings are computed at load time (the
result of a call, an extension-registry code) is reported as unresolvable. REDUCE, NEWOBJ,
NEWOBJ_EX, OBJ and INST on anything but an allowlisted global are unsafe; so are BUILD, APPEND or
SETITEM applied to a global itself (they would patch a module-level object). Arguments are decoded
here rather than by genops so a 4 GiB BINBYTES8 is skipped, not copied.

FRAME is read the way CPython's C unpickler reads it from a file object (Modules/_pickle.c): the
frame is one buffer, and a read that runs past its end drops the rest of the buffer and continues
from the file position after the frame. `pickle.loads(bytes)` instead reads straight through. No
pickler writes an opcode across a frame end, so when the straight walk sees one
(`PickleScan.frame_crossings`), the stream is hostile: it is never called safe, and it is walked a
second time as the file reader sees it, adding whatever that reading imports or calls.
tests/test_checkpoint_differential.py checks the scan against the real unpickler.

A stream may hold several pickles back to back (torch's legacy format holds five); `expected`
says how many must parse, and with `scan_trailing` whatever follows is scanned as further
pickles too (their unsafe globals count; a part that does not parse there is only reported).

Bounded: opcodes (`ScanLimits.max_opcodes`), mark and container nesting (`max_depth`), memo
entries, the length of a protocol-0 text line, and bytes (the data itself). Hitting a bound ends
the scan with `complete=False`, which never counts as safe.

Known limitations: values are tracked only as far as needed to resolve names and persistent ids
(tuples of up to 16 items); the scanner does not evaluate calls, so a name built by an
allowlisted call would be unresolvable (no allowlisted callable returns a string today).
"""

from __future__ import annotations

import _compat_pickle
import codecs
import pickletools
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch_skills.checkpoint.allowlist import JOBLIB_ARRAYS, Policy, Risk, Tier, risk_of, words

# torch.load's weights_only unpickler refuses these modules even when a user allowlists them
# (torch 2.13, torch/_weights_only_unpickler.py, _blocklisted_modules).
TORCH_BLOCKLISTED_MODULES = frozenset({"sys", "os", "posix", "nt"})

# Callables whose bytes argument is itself unpickled: scanned too, so the report names the
# payload inside (the outer call is unsafe either way).
NESTED_LOADERS = frozenset(
    {"pickle.loads", "_pickle.loads", "pickle._loads", "dill.loads", "torch.storage._load_from_bytes"}
)

_OPS: list[pickletools.OpcodeInfo | None] = [None] * 256
for _op in pickletools.opcodes:
    _OPS[ord(_op.code)] = _op

_FIXED_ARGS = {
    "uint1": (struct.Struct("<B"), 1),
    "uint2": (struct.Struct("<H"), 2),
    "int4": (struct.Struct("<i"), 4),
    "uint4": (struct.Struct("<I"), 4),
    "uint8": (struct.Struct("<Q"), 8),
    "float8": (struct.Struct(">d"), 8),
}
# length-prefixed arguments: (length format, length size, what the bytes become)
_SIZED_ARGS = {
    "string1": (struct.Struct("<B"), 1, "str"),
    "string4": (struct.Struct("<i"), 4, "str"),
    "bytes1": (struct.Struct("<B"), 1, "bytes"),
    "bytes4": (struct.Struct("<I"), 4, "bytes"),
    "bytes8": (struct.Struct("<Q"), 8, "bytes"),
    "bytearray8": (struct.Struct("<Q"), 8, "bytes"),
    "unicodestring1": (struct.Struct("<B"), 1, "utf8"),
    "unicodestring4": (struct.Struct("<I"), 4, "utf8"),
    "unicodestring8": (struct.Struct("<Q"), 8, "utf8"),
    "long1": (struct.Struct("<B"), 1, "long"),
    "long4": (struct.Struct("<i"), 4, "long"),
}


@dataclass(frozen=True)
class ScanLimits:
    """Bounds that keep a hostile pickle from costing unbounded time or memory."""

    max_opcodes: int = 50_000_000  # a 100k-tensor state dict is ~3M opcodes
    max_depth: int = 1_000  # MARK and container nesting; real checkpoints stay under 20
    max_memo: int = 5_000_000  # memo entries (each keeps a symbolic value alive)
    inline_arg_bytes: int = 1 << 20  # larger str/bytes arguments are skipped, not copied
    max_line_bytes: int = 1 << 20  # a protocol-0 text argument (GLOBAL, STRING, INT...)
    max_recorded: int = 200  # unsafe references kept in detail (all are counted)
    max_persistent_ids: int = 2_000_000
    max_nested: int = 3  # pickles inside pickles followed


@dataclass
class UnsafeRef:
    """One reason a pickle is unsafe: a global outside the allowlist, or a call the scan cannot name."""

    source: str
    offset: int  # byte offset of the opcode in `source`
    opcode: str
    module: str | None  # None when the reference cannot be resolved statically
    name: str | None
    reason: str
    risk: Risk
    called_at: int | None = None  # offset of the REDUCE/NEWOBJ/OBJ/INST that calls it
    raw: str | None = None  # the name as written, when a Python 2 rename changed it

    @property
    def qualified(self) -> str | None:
        return f"{self.module}.{self.name}" if self.module is not None else None


@dataclass
class PickleScan:
    """What scanning one pickle stream found."""

    source: str
    size: int
    pickles: int = 0  # pickles parsed up to STOP
    protocol: int | None = None  # highest PROTO seen
    opcodes: int = 0
    complete: bool = False  # the expected pickles all parsed without error or limit
    error: str | None = None
    error_offset: int | None = None
    limit_hit: bool = False
    truncated: bool = False  # the data ended before the pickle did (more bytes could change the verdict)
    globals_used: dict[str, Tier] = field(default_factory=dict)
    unsafe: list[UnsafeRef] = field(default_factory=list)
    unsafe_total: int = 0
    persistent_ids: list[tuple] = field(default_factory=list)
    max_depth: int = 0
    end_offset: int = 0  # where the last parsed pickle ended
    trailing_bytes: int = 0  # bytes after end_offset that were not parsed as pickles
    trailing_error: str | None = None
    frame_crossings: int = 0  # reads that run past the end of a FRAME (readers disagree)
    frame_crossing_offset: int | None = None
    frame_crossing_what: str | None = None
    file_reader_globals: list[str] = field(default_factory=list)  # names only the file reader sees

    @property
    def safe(self) -> bool:
        return self.complete and self.unsafe_total == 0 and self.frame_crossings == 0


class _Malformed(Exception):
    def __init__(self, message: str, offset: int):
        super().__init__(message)
        self.offset = offset


class _LimitHit(_Malformed):
    pass


class _Truncated(_Malformed):
    """The data ended before the pickle did."""


class _Ref:
    """A global the pickle names (GLOBAL, STACK_GLOBAL, INST, EXT*)."""

    __slots__ = ("qualified", "offset", "allowed", "entry")

    def __init__(self, qualified: str | None, offset: int, allowed: bool, entry: UnsafeRef | None):
        self.qualified = qualified
        self.offset = offset
        self.allowed = allowed
        self.entry = entry


class _Made:
    """An object a call (REDUCE, NEWOBJ, OBJ, INST) would create."""

    __slots__ = ("callee", "offset", "depth", "args", "state")

    def __init__(self, callee: Any, offset: int, depth: int, args: Any = None):
        self.callee = callee
        self.offset = offset
        self.depth = depth
        self.args = args  # the argument tuple, when short (joblib's dtype string)
        self.state = None  # what BUILD gave it (a numpy dtype's elsize and flags)


class _Box:
    """A container; items are kept only for short tuples and lists (persistent ids, arguments)."""

    __slots__ = ("kind", "items", "depth")

    def __init__(self, kind: str, items: list | None, depth: int):
        self.kind = kind
        self.items = items
        self.depth = depth


class _Big:
    """A str/bytes argument too large to copy; only its length is kept."""

    __slots__ = ("kind", "length")

    def __init__(self, kind: str, length: int):
        self.kind = kind
        self.length = length


class _Opaque:
    __slots__ = ("kind",)

    def __init__(self, kind: str):
        self.kind = kind


_SHORT_ITEMS = 16


def _depth(value: Any) -> int:
    return value.depth if isinstance(value, (_Box, _Made)) else 0


def _describe(value: Any) -> str:
    if isinstance(value, _Ref):
        return value.qualified or "an unresolvable global"
    if isinstance(value, _Made):
        return f"the result of calling {_describe(value.callee)} (at offset {value.offset})"
    if isinstance(value, _Box):
        return f"a {value.kind}"
    if isinstance(value, (_Big, _Opaque)):
        return f"a {value.kind}"
    return f"a {type(value).__name__} constant"


def _is_joblib_wrapper(value: Any) -> bool:
    callee = value.callee if isinstance(value, _Made) else None
    return isinstance(callee, _Ref) and callee.allowed and callee.qualified in JOBLIB_ARRAYS


def _dict_items(value: Any) -> dict[str, Any]:
    """The string-keyed items of a short dict box (a BUILD state), else {}."""
    if not isinstance(value, _Box) or value.kind != "dict" or value.items is None:
        return {}
    items = value.items
    return {k: v for k, v in zip(items[::2], items[1::2], strict=False) if type(k) is str}


def _plain_fields(fields: Any) -> bool:
    """True when a record dtype's fields dict (short, fully kept) holds only plain scalar dtypes."""
    if not isinstance(fields, _Box) or fields.kind != "dict" or not fields.items:
        return False
    for value in fields.items[1::2]:
        parts = value.items if isinstance(value, _Box) and value.kind == "tuple" else None
        dtype = parts[0] if parts else None
        args = dtype.args.items if isinstance(dtype, _Made) and isinstance(dtype.args, _Box) else None
        descr = args[0] if args else None
        if type(descr) is not str or descr.lstrip("<>|=!")[:1] not in tuple("biufcMmUS?"):
            return False
        state = dtype.state.items if isinstance(dtype.state, _Box) and dtype.state.items else []
        if len(state) > 7 and (type(state[7]) is not int or state[7] & 1 or state[3] is not None):
            return False
    return True


def _joblib_item(descr: str, state: Any) -> tuple[bool, int | None]:
    """(holds objects, item size) of the numpy dtype `numpy.dtype(descr)` rebuilt with BUILD `state`
    (version, byte order, subarray, names, fields, elsize, alignment, flags): flexible types ('U5'
    pickles as 'U5' with elsize 20) take their size from the state; a structured dtype is only
    followed when its flags say it holds objects (then joblib unpickles it); None: cannot size."""
    from torch_skills.checkpoint.npy_format import dtype_facts

    items = state.items if isinstance(state, _Box) and state.kind == "tuple" and state.items else []
    names, fields, elsize, flags = (items[3:6] + [None, None, None])[:3] + [items[7] if len(items) > 7 else 0]
    kind = descr.lstrip("<>|=!")[:1]
    if kind == "O" or (type(flags) is int and flags & 1):  # NPY_ITEM_HASOBJECT
        return True, None
    if len(items) > 2 and items[2] is not None:
        return False, None  # a subarray dtype: not followed
    if names is not None or fields is not None:
        # a record dtype: raw bytes only when every field is a plain scalar (numpy takes hasobject from
        # the state's flags, older versions from the fields: both must say "no objects")
        plain = _plain_fields(fields)
        return False, (elsize if plain and type(elsize) is int and elsize >= 0 else None)
    if kind in ("U", "S", "V"):
        return False, elsize if type(elsize) is int and elsize >= 0 else None
    if kind not in tuple("biufcMm?"):
        return False, None
    has_object, itemsize, refused = dtype_facts(descr)
    return has_object, None if refused else itemsize


def _plain(value: Any) -> Any:
    """A persistent id part as plain data: globals become their dotted names."""
    if isinstance(value, _Ref):
        return value.qualified
    if isinstance(value, _Box):
        return tuple(_plain(v) for v in value.items) if value.items is not None else f"<{value.kind}>"
    if isinstance(value, (_Made, _Big, _Opaque)):
        return f"<{type(value).__name__.strip('_').lower()}>"
    return value


def map_python2_name(module: str, name: str) -> tuple[str, str]:
    """The module and name Python 3 (and torch.load) import for a protocol 0-2 `module name` pair."""
    if (module, name) in _compat_pickle.NAME_MAPPING:
        return _compat_pickle.NAME_MAPPING[(module, name)]
    if module in _compat_pickle.IMPORT_MAPPING:
        return _compat_pickle.IMPORT_MAPPING[module], name
    return module, name


class _Machine:
    """Symbolic unpickler over data[start:]; one instance per stream."""

    def __init__(
        self,
        data: Any,
        source: str,
        policy: Policy,
        limits: ScanLimits,
        result: PickleScan,
        nested: Callable[[bytes, str, int], list[UnsafeRef]] | None,
        file_mode: bool = False,
        start: int = 0,
    ):
        self.data = data
        self.end = len(data)
        self.source = source
        self.policy = policy
        self.limits = limits
        self.result = result
        self.nested = nested
        self.pos = start
        self.proto = 0
        self.file_mode = file_mode
        self.buf_end = start if file_mode else self.end  # end of the bytes the reader holds in memory
        self.file_pos = start  # file reader: where the next read from the file starts
        self.frame_end: int | None = None  # straight reader: end of the FRAME being read

    # -- reading ---------------------------------------------------------------------------------
    # Two readers of the same bytes. The straight reader walks the stream in order, as
    # pickle.loads(bytes) does. The file reader copies CPython's C unpickler reading from a file
    # object without peek() (io.BytesIO: torch.load's data.pkl, pickle.load on a BytesIO): FRAME
    # reads its whole frame into a buffer, and a read that runs past the buffer's end drops the
    # rest of the buffer and takes fresh bytes from the file position after it
    # (Modules/_pickle.c, _Unpickler_ReadImpl / _Unpickler_ReadFromFile / load_frame). The two
    # agree unless some read crosses a frame's end, which no pickler writes; the straight reader
    # records every such crossing.
    def _take(self, n: int, what: str) -> int:
        """Offset of the next n bytes, consumed; raises _Malformed when the data ends first."""
        if n < 0:
            raise _Malformed(f"{what} declares a negative length {n}", self.op_pos)
        start = self.pos
        if start + n <= self.buf_end:
            if self.frame_end is not None and start < self.frame_end < start + n:
                self._crossing(what)
            self.pos = start + n
            return start
        if not self.file_mode:
            raise _Truncated(
                f"{what} declares {n} bytes but only {self.end - self.pos} remain in {self.source}",
                self.op_pos,
            )
        # C unpickler: the rest of the buffer is dropped and n bytes come from the file
        start = self.file_pos
        if start + n > self.end:
            raise _Truncated(
                f"{what} declares {n} bytes but only {self.end - start} remain in {self.source}",
                self.op_pos,
            )
        self.file_pos = self.buf_end = self.pos = start + n
        return start

    def _crossing(self, what: str) -> None:
        self.result.frame_crossings += 1
        if self.result.frame_crossing_offset is None:
            self.result.frame_crossing_offset = self.op_pos
            self.result.frame_crossing_what = what

    def _need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.end:
            raise _Malformed(
                f"{what} declares {n} bytes but only {self.end - self.pos} remain in {self.source}",
                self.op_pos,
            )

    def _line(self) -> bytes:
        limit = min(self.buf_end, self.pos + self.limits.max_line_bytes)
        nl = self.data.find(b"\n", self.pos, limit)
        if nl >= 0:
            if self.frame_end is not None and self.pos < self.frame_end <= nl:
                self._crossing(f"{self.op_name} text argument")
            line = bytes(self.data[self.pos : nl])
            self.pos = nl + 1
            return line
        if self.file_mode and self.buf_end < self.end:  # C: readline() on the file, buffer dropped
            start = self.file_pos
            nl = self.data.find(b"\n", start, min(self.end, start + self.limits.max_line_bytes))
            if nl >= 0:
                self.file_pos = self.buf_end = self.pos = nl + 1
                return bytes(self.data[start:nl])
        raise (_Truncated if limit >= self.end else _Malformed)(
            f"{self.op_name} needs a newline-terminated argument; none within {limit - self.pos} bytes",
            self.op_pos,
        )

    def _read_arg(self, kind: str) -> Any:
        fixed = _FIXED_ARGS.get(kind)
        if fixed is not None:
            fmt, size = fixed
            at = self._take(size, self.op_name)
            (value,) = fmt.unpack_from(self.data, at)
            return value
        sized = _SIZED_ARGS.get(kind)
        if sized is not None:
            fmt, size, as_ = sized
            at = self._take(size, self.op_name)
            (length,) = fmt.unpack_from(self.data, at)
            if length < 0:
                raise _Malformed(f"{self.op_name} has a negative length {length}", self.op_pos)
            at = self._take(length, self.op_name)
            if length > self.limits.inline_arg_bytes:
                return _Big(as_, length)
            raw = bytes(self.data[at : at + length])
            if as_ == "bytes":
                return raw
            if as_ == "long":
                return int.from_bytes(raw, "little", signed=True)
            if as_ == "str":
                return raw.decode("latin-1")
            try:
                return raw.decode("utf-8", "surrogatepass")
            except UnicodeDecodeError as e:
                raise _Malformed(f"{self.op_name} holds invalid UTF-8 ({e.reason})", self.op_pos) from None
        return self._read_text_arg(kind)

    def _read_text_arg(self, kind: str) -> Any:
        try:
            if kind == "stringnl_noescape_pair":
                module = self._line().decode("utf-8")
                name = self._line().decode("utf-8")
                return module, name
            line = self._line()
            if kind == "stringnl_noescape":
                return line.decode("ascii")
            if kind == "stringnl":
                if len(line) < 2 or line[0] != line[-1] or line[:1] not in (b'"', b"'"):
                    raise _Malformed("the STRING argument must be quoted", self.op_pos)
                return codecs.escape_decode(line[1:-1])[0].decode("latin-1")
            if kind == "unicodestringnl":
                return line.decode("raw-unicode-escape")
            if kind == "decimalnl_short":
                if self.op_name in ("GET", "PUT"):
                    return int(line)  # memo indices are base 10 in both unpicklers
                if line == b"00":
                    return False
                if line == b"01":
                    return True
                return int(line, 0)  # INT takes any base, as pickle's load_int does
            if kind == "decimalnl_long":
                return int(line[:-1] if line.endswith(b"L") else line, 0)
            if kind == "floatnl":
                return float(line)
        except (UnicodeDecodeError, ValueError) as e:
            raise _Malformed(f"{self.op_name} has an undecodable argument ({e})", self.op_pos) from None
        raise _Malformed(f"no decoder for argument kind {kind}", self.op_pos)

    # -- bookkeeping -----------------------------------------------------------------------------
    def _unsafe(self, entry: UnsafeRef) -> UnsafeRef:
        self.result.unsafe_total += 1
        if len(self.result.unsafe) < self.limits.max_recorded:
            self.result.unsafe.append(entry)
        return entry

    def _global(self, module: str, name: str, opcode: str) -> _Ref:
        raw = f"{module}.{name}"
        module, name = map_python2_name(module, name)
        qualified = f"{module}.{name}"
        tier = self.policy.classify(qualified)
        if tier is not None:
            self.result.globals_used[qualified] = tier
            return _Ref(qualified, self.op_pos, True, None)
        risk = risk_of(qualified)
        if module.split(".", 1)[0] in TORCH_BLOCKLISTED_MODULES:
            reason = (
                "it reaches the operating system; torch's weights_only loader blocks its module even when "
                "allowlisted"
            )
        elif risk == "code_execution":
            reason = "it can run code or reach the system when the file is loaded"
        elif risk == "data":
            reason = "a plain data class; this scan's policy does not allow it"
        else:
            reason = "it is not in the weights_only allowlist; torch.load(weights_only=True) refuses it"
        entry = self._unsafe(
            UnsafeRef(
                self.source,
                self.op_pos,
                opcode,
                module,
                name,
                reason,
                risk,
                raw=raw if raw != qualified else None,
            )
        )
        return _Ref(qualified, self.op_pos, False, entry)

    def _unresolvable(self, opcode: str, reason: str) -> UnsafeRef:
        return self._unsafe(UnsafeRef(self.source, self.op_pos, opcode, None, None, reason, "code_execution"))

    def _call(self, callee: Any, args: Any, opcode: str) -> _Made:
        if isinstance(callee, _Ref):
            if callee.entry is not None and callee.entry.called_at is None:
                callee.entry.called_at = self.op_pos
            if callee.qualified in NESTED_LOADERS:
                self._scan_nested(args)
        else:
            self._unresolvable(
                opcode, f"{opcode} calls {_describe(callee)}, which is not a named global the scan can check"
            )
        depth = _depth(args) + 1
        self._check_depth(depth)
        return _Made(callee, self.op_pos, depth, args if isinstance(args, _Box) else None)

    def _scan_nested(self, args: Any) -> None:
        if self.nested is None or not isinstance(args, _Box) or not args.items:
            return
        payload = args.items[0]
        if isinstance(payload, (bytes, str)) and payload:
            data = payload.encode("latin-1") if isinstance(payload, str) else payload
            for entry in self.nested(data, f"{self.source} -> bytes at offset {self.op_pos}", self.op_pos):
                self._unsafe(entry)

    def _check_depth(self, depth: int) -> None:
        if depth > self.result.max_depth:
            self.result.max_depth = depth
            if depth > self.limits.max_depth:
                raise _LimitHit(
                    f"nesting deeper than {self.limits.max_depth} levels (a hostile or broken pickle)",
                    self.op_pos,
                )

    def _mutate(self, target: Any, values: list, opcode: str) -> None:
        if isinstance(target, _Ref):
            self._unresolvable(
                opcode,
                f"{opcode} modifies the global {target.qualified or '?'} itself, which patches a module-level object",
            )
            return
        if isinstance(target, (_Box, _Made)):
            if values:
                depth = max(_depth(v) for v in values) + 1
                if depth > target.depth:
                    target.depth = depth
                    self._check_depth(depth)
            if isinstance(target, _Box) and target.items is not None:
                limit = 2 * _SHORT_ITEMS if target.kind == "dict" else _SHORT_ITEMS
                growing = opcode.startswith("APPEND") or (
                    target.kind == "dict" and opcode.startswith("SETITEM")
                )
                if growing and len(target.items) + len(values) <= limit:
                    target.items.extend(values)
                elif growing:
                    target.items = None
            return
        raise _Malformed(f"{opcode} on {_describe(target)}, which the unpickler cannot extend", self.op_pos)

    def _joblib_array(self, state: Any) -> _Opaque:
        """Step over the array joblib.load reads right after a NumpyArrayWrapper's BUILD: a padding
        byte and its padding, then shape x itemsize raw bytes; an object dtype is a pickle there."""
        fields = _dict_items(state)
        dtype = fields.get("dtype")
        shape = fields.get("shape")
        dtype_args = dtype.args.items if isinstance(dtype, _Made) and isinstance(dtype.args, _Box) else None
        descr = dtype_args[0] if dtype_args else None
        dims = shape.items if isinstance(shape, _Box) and shape.kind == "tuple" else None
        if type(descr) is not str or dims is None or not all(type(d) is int and d >= 0 for d in dims):
            raise _Malformed("a joblib array wrapper whose dtype or shape the scan cannot read", self.op_pos)
        has_object, itemsize = _joblib_item(descr, dtype.state)
        if has_object:
            inner = PickleScan(source=f"{self.source} (joblib object array at {self.pos})", size=0)
            machine = _Machine(
                self.data, inner.source, self.policy, self.limits, inner, self.nested, start=self.pos
            )
            _run(machine, inner, 1, scan_trailing=False)
            for entry in inner.unsafe:
                self._unsafe(entry)
            self.result.unsafe_total += max(0, inner.unsafe_total - len(inner.unsafe))
            self.result.globals_used.update(inner.globals_used)
            if not inner.complete:
                raise _Malformed(f"the joblib object array's pickle does not parse: {inner.error}", self.pos)
            self.pos = machine.pos
            return _Opaque("numpy object array")
        if itemsize is None:
            raise _Malformed(
                "a joblib array whose dtype the scan cannot size (structured or unknown)", self.op_pos
            )
        if fields.get("numpy_array_alignment_bytes") is not None:
            padding = self.data[self._take(1, "the joblib padding byte")]
            self._take(padding, "the joblib padding")
        count = 1
        for d in dims:
            count *= d
        self._take(count * itemsize, "a joblib array's raw bytes")
        return _Opaque("numpy array")

    # -- stack -----------------------------------------------------------------------------------
    def _pop(self) -> Any:
        if not self.stack:
            raise _Malformed(f"{self.op_name} pops from an empty stack", self.op_pos)
        return self.stack.pop()

    def _top(self) -> Any:
        if not self.stack:
            raise _Malformed(f"{self.op_name} needs a value on an empty stack", self.op_pos)
        return self.stack[-1]

    def _pop_mark(self) -> list:
        if not self.metastack:
            raise _Malformed(f"{self.op_name} without a MARK", self.op_pos)
        items = self.stack
        self.stack = self.metastack.pop()
        return items

    def _container(self, kind: str, items: list) -> _Box:
        depth = (max(_depth(v) for v in items) + 1) if items else 0
        self._check_depth(depth)
        short = len(items) <= (2 * _SHORT_ITEMS if kind == "dict" else _SHORT_ITEMS)
        keep = list(items) if kind in ("tuple", "list", "dict") and short else None
        return _Box(kind, keep, depth)

    # -- one pickle ------------------------------------------------------------------------------
    def run_one(self) -> None:
        """Parse one pickle from self.pos to its STOP (inclusive); raise _Malformed otherwise."""
        self.stack: list[Any] = []
        self.metastack: list[list[Any]] = []
        self.memo: dict[int, Any] = {}
        self.op_pos = self.pos
        self.op_name = "start"
        result, data, limits = self.result, self.data, self.limits
        while True:
            if self.frame_end is not None and self.pos >= self.frame_end:
                self.frame_end = None
            self.op_pos = self.pos
            if self.pos >= self.end or (
                self.file_mode and self.pos >= self.buf_end and self.file_pos >= self.end
            ):
                raise _Truncated("the pickle ends without a STOP opcode (truncated or broken)", self.pos)
            self.op_name = "opcode"
            at = self._take(1, "the next opcode")
            self.op_pos = at
            op = _OPS[data[at]]
            if op is None:
                raise _Malformed(
                    f"unknown opcode 0x{data[at]:02x}: no unpickler defines it (broken or hostile)", at
                )
            self.op_name = op.name
            result.opcodes += 1
            if result.opcodes > limits.max_opcodes:
                raise _LimitHit(f"more than {limits.max_opcodes} opcodes", self.op_pos)
            arg = self._read_arg(op.arg.name) if op.arg is not None else None
            if self._step(op.name, arg):
                return

    def _step(self, name: str, arg: Any) -> bool:  # noqa: C901 - one branch per opcode family
        stack = self.stack
        if name in _PUSH_ARG:
            stack.append(arg)
        elif name in _PUSH_CONST:
            stack.append(_PUSH_CONST[name])
        elif name in ("EMPTY_LIST", "EMPTY_TUPLE", "EMPTY_DICT", "EMPTY_SET"):
            kind = name[6:].lower()
            stack.append(_Box(kind, [] if kind in ("list", "tuple", "dict") else None, 0))
        elif name == "MARK":
            if len(self.metastack) >= self.limits.max_depth:
                raise _LimitHit(f"more than {self.limits.max_depth} nested MARKs", self.op_pos)
            self.metastack.append(stack)
            self.stack = []
            self._check_depth(len(self.metastack))
        elif name in ("TUPLE", "LIST", "DICT", "FROZENSET"):
            items = self._pop_mark()
            if name == "DICT" and len(items) % 2:
                raise _Malformed("DICT with an odd number of items", self.op_pos)
            self.stack.append(self._container(name.lower(), items))
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            if len(stack) < n:
                raise _Malformed(f"{name} needs {n} values on the stack", self.op_pos)
            items = stack[-n:]
            del stack[-n:]
            stack.append(self._container("tuple", items))
        elif name == "APPEND":
            value = self._pop()
            self._mutate(self._top(), [value], name)
        elif name in ("APPENDS", "ADDITEMS"):
            items = self._pop_mark()
            self._mutate(self._top(), items, name)
        elif name == "SETITEM":
            value = self._pop()
            key = self._pop()
            self._mutate(self._top(), [key, value], name)
        elif name == "SETITEMS":
            items = self._pop_mark()
            if len(items) % 2:
                raise _Malformed("SETITEMS with an odd number of items", self.op_pos)
            self._mutate(self._top(), items, name)
        elif name == "POP":
            if stack:
                stack.pop()
            else:
                self._pop_mark()
        elif name == "POP_MARK":
            self._pop_mark()
        elif name == "DUP":
            stack.append(self._top())
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            index = int(arg)
            if index not in self.memo:
                raise _Malformed(f"{name} {index}: no such memo entry", self.op_pos)
            stack.append(self.memo[index])
        elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            index = len(self.memo) if name == "MEMOIZE" else int(arg)
            if index < 0:
                raise _Malformed(f"{name} with a negative index", self.op_pos)
            self.memo[index] = self._top()
            if len(self.memo) > self.limits.max_memo:
                raise _LimitHit(f"more than {self.limits.max_memo} memo entries", self.op_pos)
        elif name in ("GLOBAL", "INST"):
            module, attr = arg
            ref = self._global(module, attr, name)
            if name == "GLOBAL":
                stack.append(ref)
            else:
                items = self._pop_mark()
                self.stack.append(self._call(ref, self._container("tuple", items), name))
        elif name == "STACK_GLOBAL":
            attr = self._pop()
            module = self._pop()
            if type(module) is str and type(attr) is str:
                stack.append(self._global(module, attr, name))
            else:
                entry = self._unresolvable(
                    name,
                    f"STACK_GLOBAL takes its module from {_describe(module)} and its name from "
                    f"{_describe(attr)}: computed at load time, so the import cannot be checked",
                )
                stack.append(_Ref(None, self.op_pos, False, entry))
        elif name in ("EXT1", "EXT2", "EXT4"):
            entry = self._unresolvable(
                name,
                f"{name} {arg} names a global through copyreg's extension registry, which the file "
                "itself can fill at load time",
            )
            stack.append(_Ref(None, self.op_pos, False, entry))
        elif name == "REDUCE":
            args = self._pop()
            callee = self._top()
            stack[-1] = self._call(callee, args, name)
        elif name == "NEWOBJ":
            args = self._pop()
            cls = self._pop()
            stack.append(self._call(cls, args, name))
        elif name == "NEWOBJ_EX":
            kwargs = self._pop()
            args = self._pop()
            cls = self._pop()
            stack.append(self._call(cls, _Box("tuple", None, max(_depth(args), _depth(kwargs))), name))
        elif name == "OBJ":
            items = self._pop_mark()
            if not items:
                raise _Malformed("OBJ without a class", self.op_pos)
            self.stack.append(self._call(items[0], self._container("tuple", items[1:]), name))
        elif name == "BUILD":
            state = self._pop()
            target = self._top()
            if isinstance(target, _Ref):
                self._unresolvable(
                    name,
                    f"BUILD sets attributes on the global {target.qualified or '?'} itself "
                    "(patches a module-level object)",
                )
            elif isinstance(target, (_Made, _Box)):
                depth = _depth(state) + 1
                if depth > target.depth:
                    target.depth = depth
                    self._check_depth(depth)
                if isinstance(target, _Made):
                    target.state = state
                if _is_joblib_wrapper(target):
                    stack[-1] = self._joblib_array(state)
        elif name in ("PERSID", "BINPERSID"):
            pid = arg if name == "PERSID" else self._pop()
            if len(self.result.persistent_ids) < self.limits.max_persistent_ids:
                self.result.persistent_ids.append(_plain(pid) if isinstance(pid, _Box) else (pid,))
            stack.append(_Opaque("persistent object"))
        elif name == "NEXT_BUFFER":
            stack.append(_Opaque("out-of-band buffer"))
        elif name == "READONLY_BUFFER":
            self._top()
        elif name == "FRAME":
            # load_frame: the frame is read as one block, then parsing restarts at its first byte
            start = self._take(arg, "FRAME")
            self.pos = start
            if not self.file_mode:
                self.frame_end = start + arg
        elif name == "PROTO":
            if arg > 5:
                raise _Malformed(f"unsupported pickle protocol {arg}", self.op_pos)
            self.proto = arg
            if self.result.protocol is None or arg > self.result.protocol:
                self.result.protocol = arg
        elif name == "STOP":
            self._pop()
            if self.file_mode:  # the next load() starts where the file reader stopped
                self.pos = self.buf_end = max(self.pos, self.file_pos)
                self.file_pos = self.pos
            return True
        else:  # pragma: no cover - every pickletools opcode is handled above (a test checks it)
            raise _Malformed(f"opcode {name} is not modelled", self.op_pos)
        return False


_PUSH_ARG = frozenset(
    words(
        "INT BININT BININT1 BININT2 LONG LONG1 LONG4 STRING BINSTRING SHORT_BINSTRING BINBYTES "
        "SHORT_BINBYTES BINBYTES8 BYTEARRAY8 UNICODE SHORT_BINUNICODE BINUNICODE BINUNICODE8 FLOAT BINFLOAT"
    )
)
_PUSH_CONST = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}

HANDLED_OPCODES = (
    _PUSH_ARG
    | set(_PUSH_CONST)
    | set(
        words(
            "EMPTY_LIST EMPTY_TUPLE EMPTY_DICT EMPTY_SET MARK TUPLE LIST DICT FROZENSET TUPLE1 TUPLE2 "
            "TUPLE3 APPEND APPENDS ADDITEMS SETITEM SETITEMS POP POP_MARK DUP GET BINGET LONG_BINGET PUT "
            "BINPUT LONG_BINPUT MEMOIZE GLOBAL INST STACK_GLOBAL EXT1 EXT2 EXT4 REDUCE NEWOBJ NEWOBJ_EX OBJ "
            "BUILD PERSID BINPERSID NEXT_BUFFER READONLY_BUFFER FRAME PROTO STOP"
        )
    )
)


def looks_like_pickle(head: bytes) -> bool:
    """True when bytes start like a protocol 2-5 pickle (PROTO opcode and a known protocol)."""
    return len(head) >= 2 and head[0] == 0x80 and head[1] <= 5


def scan_pickle(
    data: Any,
    source: str,
    policy: Policy | None = None,
    limits: ScanLimits | None = None,
    *,
    expected: int = 1,
    scan_trailing: bool = True,
    nested: Callable[[bytes, str, int], list[UnsafeRef]] | None = None,
    start: int = 0,
) -> PickleScan:
    """Scan `expected` pickles from offset `start` of `data`, then (optionally) any that follow.

    `nested(data, source, offset)` scans a bytes argument handed to a loader such as
    `pickle.loads`; by default nested pickles are scanned with the same policy.
    """
    policy = policy or Policy()
    limits = limits or ScanLimits()
    result = PickleScan(source=source, size=len(data) - start)
    if nested is None:
        nested = _default_nested(policy, limits, 1)
    _run(_Machine(data, source, policy, limits, result, nested, start=start), result, expected, scan_trailing)
    if result.frame_crossings:
        _scan_as_file_reader(data, source, policy, limits, result, nested, expected, scan_trailing, start)
    return result


def _run(machine: _Machine, result: PickleScan, expected: int, scan_trailing: bool) -> None:
    try:
        for _ in range(expected):
            machine.run_one()
            result.pickles += 1
            result.end_offset = machine.pos
        result.complete = True
    except _Malformed as e:
        result.error = str(e)
        result.error_offset = e.offset
        result.limit_hit = isinstance(e, _LimitHit)
        result.truncated = isinstance(e, _Truncated)
        result.end_offset = machine.pos
        result.trailing_bytes = machine.end - result.end_offset
        return
    if scan_trailing:
        while machine.pos < machine.end:
            start = machine.pos
            try:
                machine.run_one()
                result.pickles += 1
                result.end_offset = machine.pos
            except _Malformed as e:
                result.trailing_error = f"bytes from offset {start} are not a pickle: {e}"
                result.limit_hit = result.limit_hit or isinstance(e, _LimitHit)
                if isinstance(e, _LimitHit):
                    result.complete = False
                    result.error, result.error_offset = str(e), e.offset
                break
    result.trailing_bytes = machine.end - result.end_offset


def _scan_as_file_reader(
    data: Any,
    source: str,
    policy: Policy,
    limits: ScanLimits,
    result: PickleScan,
    nested,
    expected: int,
    scan_trailing: bool,
    start: int = 0,
) -> None:
    """Scan again the way the C unpickler reads a file, and add what only that reading names."""
    other = PickleScan(source=f"{source} (as read from a file)", size=len(data) - start)
    machine = _Machine(data, other.source, policy, limits, other, nested, file_mode=True, start=start)
    _run(machine, other, expected, scan_trailing)
    seen = {u.qualified for u in result.unsafe}
    for qualified, tier in other.globals_used.items():
        result.globals_used.setdefault(qualified, tier)
    for entry in other.unsafe:
        if entry.qualified not in seen or entry.qualified is None:
            result.file_reader_globals.append(entry.qualified or f"unresolvable {entry.opcode}")
            result.unsafe_total += 1
            if len(result.unsafe) < limits.max_recorded:
                result.unsafe.append(entry)
    result.unsafe_total += max(0, other.unsafe_total - len(other.unsafe))
    result.limit_hit = result.limit_hit or other.limit_hit


def _default_nested(policy: Policy, limits: ScanLimits, level: int):
    def scan_nested(data: bytes, source: str, offset: int) -> list[UnsafeRef]:
        if level > limits.max_nested or not data or _OPS[data[0]] is None:
            return []
        inner = scan_pickle(data, source, policy, limits, nested=_default_nested(policy, limits, level + 1))
        return inner.unsafe

    return scan_nested
