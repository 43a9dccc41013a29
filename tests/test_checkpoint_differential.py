"""The static scan against CPython's real unpickler: every global the unpickler resolves, the scan saw.

Every pickle-bearing stream of the test corpus (files, archive members), a set of FRAME-boundary
tricks, and seeded mutations of all of them go through tests/fixtures/recording_unpickler.py in
a child process with memory, CPU and wall-clock limits (its find_class records the name and
returns an inert stand-in, so nothing of the file runs). The scan must name every global the
real unpickler resolved, in each reader mode that the scan models exactly; in the mixed mode of
a real buffered file it must at least refuse to call the stream safe when they differ.
"""

from __future__ import annotations

import io
import json
import random
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.checkpoint_support import shared_corpus
from tests.fixtures.malicious.payloads import call, glob, text
from torch_skills.checkpoint.allowlist import Policy
from torch_skills.checkpoint.pickle_scan import map_python2_name, scan_pickle

REPO_ROOT = Path(__file__).resolve().parents[1]
MAX_STREAM = 256 << 10  # larger streams (raw storages) are skipped; mutations use the first ones


def frame(body: bytes) -> bytes:
    return b"\x95" + struct.pack("<Q", len(body)) + body


def frame_tricks() -> dict[str, bytes]:
    """Streams where a straight opcode reader and the C unpickler reading a file disagree."""
    payload = b"0" + glob("os", "system") + call(text("true")) + b"."
    rest = b"\x00\x00\x00\x00" + payload + b"0N."
    tricks = {
        # BINBYTES length split across the frame end: straight reading skips the payload
        "binbytes_split": b"\x80\x04" + frame(b"B" + struct.pack("<H", 2 + len(payload))) + rest,
        # BINUNICODE the same way
        "binunicode_split": b"\x80\x04" + frame(b"X" + struct.pack("<H", 2 + len(payload))) + rest,
    }
    # a GLOBAL module line whose newline lies past the frame end: "myos" read straight, "os" from a file
    tricks["global_line_split"] = b"\x80\x04" + frame(b"N0cmy") + b"os\nsystem\n" + call(text("true")) + b"."
    # a FRAME inside a frame that claims more than the outer frame still holds: the C reader drops
    # the rest of the outer frame (a BINBYTES that, read straight, swallows the payload)
    body = payload[1:]  # nothing to pop here
    hidden = b"B" + struct.pack("<I", len(body))
    tricks["frame_in_frame"] = (
        b"\x80\x04" + frame(b"\x95" + struct.pack("<Q", len(body)) + hidden) + body + b"0N."
    )
    return tricks


def corpus_streams() -> dict[str, bytes]:
    streams: dict[str, bytes] = {}

    def add(name: str, data: bytes) -> None:
        if data and len(data) <= MAX_STREAM:
            streams[name.replace("/", "__")] = data

    def add_file(name: str, path: Path) -> None:
        data = path.read_bytes()
        if zipfile.is_zipfile(io.BytesIO(data)):
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                for info in z.infolist():
                    add(f"{name}::{info.filename}#{info.header_offset}", z.read(info))
        else:
            add(name, data)

    corpus = shared_corpus()
    for sample in corpus.samples:
        if sample.path.is_dir():
            for p in sorted(sample.path.rglob("*")):
                if p.is_file():
                    add_file(f"{sample.name}/{p.name}", p)
        else:
            add_file(sample.name, sample.path)
    streams.update({f"trick_{k}": v for k, v in frame_tricks().items()})
    return streams


def mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    kind = rng.randrange(6)
    at = rng.randrange(len(b))
    if kind == 0:
        b[at] = rng.randrange(256)
    elif kind == 1:
        del b[at : at + rng.randrange(1, 9)]
    elif kind == 2:
        b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
    elif kind == 3:  # a FRAME opcode spliced in with a length that ends mid-opcode
        b[at:at] = frame(b"")[:1] + struct.pack("<Q", rng.randrange(1, 64))
    elif kind == 4:
        b = b[:at]
    else:
        src = rng.randrange(len(b))
        b[at:at] = b[src : src + rng.randrange(1, 32)]
    return bytes(b)


def scanned_names(data: bytes) -> tuple[set[str], object]:
    scan = scan_pickle(data, "stream", Policy())
    names = set(scan.globals_used) | {u.qualified for u in scan.unsafe if u.qualified}
    return names, scan


def seen_by_scan(module: str, name: str, names: set[str]) -> bool:
    mapped = ".".join(map_python2_name(module, name))
    return f"{module}.{name}" in names or mapped in names


def run_recorder(streams: dict[str, bytes], folder: Path) -> dict:
    folder.mkdir()
    for i, data in enumerate(streams.values()):
        (folder / f"{i:05d}").write_bytes(data)
    out = folder.parent / "recorded.json"
    subprocess.run(
        [sys.executable, "-m", "tests.fixtures.recording_unpickler", str(folder), str(out)],
        cwd=REPO_ROOT,
        timeout=240,
        check=True,
        capture_output=True,
    )
    recorded = json.loads(out.read_text())
    return {name: recorded[f"{i:05d}"] for i, name in enumerate(streams)}


def differences(streams: dict[str, bytes], recorded: dict) -> list[str]:
    bad = []
    for name, data in streams.items():
        names, scan = scanned_names(data)
        for mode, got in recorded[name].items():
            missed = [f"{m}.{n}" for m, n in got["globals"] if not seen_by_scan(m, n, names)]
            if not missed:
                continue
            if mode == "file" and not scan.safe:
                continue  # a buffered file mixes both readings; the scan refused the stream
            bad.append(f"{name} [{mode}]: unpickler resolved {missed[:3]}, scan saw {sorted(names)[:5]}")
    return bad


def test_the_frame_tricks_fool_a_straight_reader_but_not_the_scan(tmp_path):
    """The C unpickler reading BytesIO resolves os/posix.system in each trick; the scan names it and refuses."""
    tricks = {k: v for k, v in frame_tricks().items()}
    recorded = run_recorder(tricks, tmp_path / "streams")
    for name, data in tricks.items():
        got = {f"{m}.{n}" for m, n in recorded[name]["bytesio"]["globals"]}
        assert got & {"os.system", "posix.system"}, (name, recorded[name])
        scan = scan_pickle(data, name)
        assert not scan.safe and scan.frame_crossings, name
        names, _ = scanned_names(data)
        assert got <= names, (name, got, names)


def test_every_global_the_real_unpickler_resolves_in_the_corpus_is_seen_by_the_scan(tmp_path):
    """Each corpus stream, read three ways by the C unpickler, resolves only globals the scan named."""
    streams = corpus_streams()
    assert len(streams) > 80
    assert differences(streams, run_recorder(streams, tmp_path / "streams")) == []


@pytest.mark.parametrize("seed", [0, 1])
def test_mutated_streams_resolve_nothing_the_scan_missed(tmp_path, seed):
    """Seeded byte flips, cuts, inserts and spliced FRAMEs of every small corpus stream keep the scan complete."""
    rng = random.Random(seed)
    base = {k: v for k, v in corpus_streams().items() if len(v) <= 16 << 10}
    streams = {f"{k}~{seed}.{j}": mutate(v, rng) for k, v in base.items() for j in range(6)}
    streams = {k: v for k, v in streams.items() if v}
    assert differences(streams, run_recorder(streams, tmp_path / "streams")) == []
