"""The safetensors header reader's two paths (the bulk pattern path and the full JSON parser) on
generated and hostile headers: they must give the same tensors, problems and metadata, and a
hostile header must cost time linear in its size.

Run: python -m pytest -q tests/test_safetensors_header_paths.py
"""

from __future__ import annotations

import gc
import json
import os
import struct
import tempfile
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torch_skills.checkpoint import safetensors_format as sf

DTYPES = [*sf.DTYPE_BYTES, "F128", "f32", ""]
SPACES = " \t\n\r\x0b\x0c"  # the last two are not JSON whitespace


def _header_file(folder: str, raw: bytes, data_bytes: int) -> str:
    raw += b" " * (-len(raw) % 8)
    path = os.path.join(folder, "h.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + bytes(data_bytes))
    return path


def _read(path: str, fast: bool) -> tuple:
    """(tensors, problems, metadata) as plain tuples, through the fast path or forced past it."""
    saved = sf._fast_header
    if not fast:
        sf._fast_header = lambda raw: None
    try:
        h = sf.read_safetensors_header(path)
    finally:
        sf._fast_header = saved
    return (
        [(t.name, t.dtype, t.shape, t.begin, t.end) for t in h.tensors],
        [(p.code, p.source, p.message, p.severity, p.blocks_safe) for p in h.problems],
        h.metadata,
        h.tensor_names,
    )


entry = st.tuples(
    st.one_of(st.text(max_size=6), st.sampled_from(["a", "b", "__metadata__", 'q"', "\\", "\u00e9", "\x01"])),
    st.sampled_from(DTYPES),
    st.lists(st.integers(-1, 4), max_size=3),
    st.integers(-2, 2),  # nudge to the offsets: 0 keeps the exact tiling
)


@st.composite
def headers(draw) -> tuple[bytes, int, bool]:
    """(header bytes, data bytes, whether it is a plain json.dumps the fast path must take)."""
    entries = draw(st.lists(entry, max_size=6))
    pairs, at = [], 0
    for name, dtype, shape, nudge in entries:
        numel = 1
        for d in shape:
            numel *= d
        span = numel * sf.DTYPE_BYTES.get(dtype, 1)
        begin = at + (nudge if draw(st.booleans()) else 0)
        end = begin + span + (0 if nudge >= 0 else nudge)
        at = max(at, end)
        pairs.append((name, {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}))
    if draw(st.booleans()):
        order = draw(st.permutations(range(len(pairs))))
        pairs = [pairs[i] for i in order]
    meta = draw(st.one_of(st.none(), st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2)))
    style = draw(st.sampled_from(["dumps", "compact", "spaced"]))
    if style == "spaced":
        space = st.text(alphabet=SPACES, max_size=2)
        comma = lambda: draw(space) + "," + draw(space)  # noqa: E731
        colon = lambda: draw(space) + ":" + draw(space)  # noqa: E731
    else:
        comma = lambda: ", " if style == "dumps" else ","  # noqa: E731
        colon = lambda: ": " if style == "dumps" else ":"  # noqa: E731

    def value(v) -> str:
        if isinstance(v, dict):
            return "{" + comma().join(json.dumps(k) + colon() + value(x) for k, x in v.items()) + "}"
        if isinstance(v, list):
            return "[" + comma().join(value(x) for x in v) + "]"
        return json.dumps(v)

    items = ([("__metadata__", meta)] if meta is not None else []) + pairs
    text = "{" + comma().join(json.dumps(k) + colon() + value(v) for k, v in items) + "}"
    raw = text.encode()
    mutated = False
    if draw(st.booleans()) and raw:
        at_byte = draw(st.integers(0, len(raw) - 1))
        new = draw(st.sampled_from([b",", b" ", b"\x0b", b'"', b"\\", b"}", b"]", b"0", b"9", b"-", b""]))
        raw, mutated = raw[:at_byte] + new + raw[at_byte + 1 :], True
    plain = (  # what the pattern reads: upper-case dtypes, non-negative numbers, no mutation
        style == "dumps"
        and not mutated
        and all(s["dtype"].isupper() and min([*s["shape"], *s["data_offsets"]]) >= 0 for _, s in pairs)
    )
    return raw, at + draw(st.integers(0, 3)), plain


def _agree(case: tuple[bytes, int, bool]) -> None:
    raw, data_bytes, plain = case
    with tempfile.TemporaryDirectory() as folder:
        path = _header_file(folder, raw, data_bytes)
        if plain:
            padded = raw + b" " * (-len(raw) % 8)
            assert sf._fast_header(padded) is not None  # a plain json.dumps header takes the fast path
        assert _read(path, fast=True) == _read(path, fast=False)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=headers())
def test_the_fast_path_and_the_json_parser_agree_on_generated_headers(case):
    """Generated and mutated headers give the same tensors, problems and metadata on both paths."""
    _agree(case)


@pytest.mark.slow
@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=headers())
def test_the_two_paths_agree_on_many_generated_headers(case):
    """The same comparison with many more examples (slow suite)."""
    _agree(case)


PATTERNS = {possessive: sf._entry_pattern(possessive) for possessive in (True, False)}


@settings(max_examples=150, deadline=None)
@given(case=headers())
def test_the_python_3_10_pattern_takes_the_same_text_as_the_possessive_one(case):
    """Without possessive runs (Python 3.10 has none) the entry pattern splits every header the same."""
    text = "," + case[0].decode("utf-8", "replace")[1:-1]
    assert PATTERNS[False].split(text) == PATTERNS[True].split(text)


HOSTILE_RUNS = {
    "escaped quotes in one name": lambda n: b'{"' + b'\\"' * n + b"x}",
    "spaces after a name": lambda n: b'{"a"' + b" " * n + b"x}",
    "commas and quotes": lambda n: b"{" + b', "' * n + b"x}",
    "half entries": lambda n: b"{" + b'"a": {"dtype": "F32", "shape": [1, ' * (n // 32) + b"x}",
}


@pytest.mark.parametrize("make", HOSTILE_RUNS.values(), ids=list(HOSTILE_RUNS))
def test_a_header_the_pattern_cannot_read_costs_linear_time(make):
    """A 200,000-unit run that the entry pattern keeps failing on is given up in well under a second."""
    raw = make(200_000)
    started = time.process_time()
    assert sf._fast_header(raw) is None
    assert time.process_time() - started < 2.0  # quadratic search: minutes


@pytest.mark.parametrize("enabled", [True, False])
def test_reading_a_header_leaves_the_garbage_collector_as_it_was(tmp_path, enabled):
    """The fast path pauses the collector and restores it, on or off, even when it gives up."""
    good = b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}'
    paths = [_header_file(str(tmp_path), good, 8), _header_file(str(tmp_path / ".."), b"{not json", 0)]
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        for path in paths:
            sf.read_safetensors_header(path)
            assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()
