"""Cost of verify_checkpoint on hostile shapes: wall time and peak memory per shape, goal < 2 s and < 256 MiB.

Run from the repository root (each shape is measured in a fresh child process):

    python bench/scan_cost.py                 # all shapes
    python bench/scan_cost.py --only bomb     # one shape

Shapes, each built in a temporary folder before timing starts:
- `zip_bomb`: a ~2 MB torch-style zip whose member `extra.pkl` (a PROTO opcode, then zeros)
  inflates to 2 GiB (its header says so), and a twin whose header claims 1 MiB.
- `self_list`: a ~600-byte pickle of a list that holds itself a couple of hundred times.
- `billion_laughs`: a list of 10 references to a list of 10 references ... 9 levels deep
  (10^9 paths through memo reuse, a few hundred bytes).
- `safetensors_500k`: a safetensors file with 500,000 one-element tensors (a ~40 MB header).
- `many_files`: a folder of 5,000 small files (pickles, safetensors, text).

What is timed is what the verify_checkpoint worker does with the file (tools/checkpoint/worker.py):
the static scan, then, when the scan calls it safe, loading it, the tensor summary, the NaN/Inf
count and the resume analysis. Peak memory is the child's peak resident set minus its resident
set after imports (ru_maxrss), so it includes the scan's buffers and the loaded objects.
For the safetensors shape the baseline is `json.loads` of its header alone in the same child (the
least any reader does), as it comes and with the garbage collector paused (as the reader runs);
the scan and the baselines are run alternately REPEATS times and the ratios of their medians are
printed. Numbers come from a shared, loaded 2-core
machine: compare within one run, not across runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
import server  # noqa: E402,F401  (registers torch_skills from this clone)

GOAL_SECONDS = 2.0
GOAL_MIB = 256


def _deflated_pickle_bomb(total: int) -> tuple[bytes, int]:
    """Deflate of a PROTO 2 header then zeros, `total` bytes in all: (compressed bytes, crc32)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = b"\x80\x02"
    chunk = bytes(1 << 24)
    parts, crc = [comp.compress(head)], zlib.crc32(head)
    left = total - len(head)
    while left > 0:
        piece = chunk[: min(len(chunk), left)]
        parts.append(comp.compress(piece))
        crc = zlib.crc32(piece, crc)
        left -= len(piece)
    parts.append(comp.flush())
    return b"".join(parts), crc


def build_zip_bomb(path: Path, lie: bool) -> None:
    """A zip with data.pkl and a member `extra.pkl` that inflates to 2 GiB, written by hand (never held inflated)."""
    total = 2 << 30
    payload, crc = _deflated_pickle_bomb(total)
    members = [
        ("archive/data.pkl", pickle.dumps({"a": 1}, protocol=2), 0, None),
        ("archive/extra.pkl", payload, 8, (crc, total)),
    ]
    out = bytearray()
    central = bytearray()
    for name, data, method, info in members:
        n = name.encode()
        if info is None:
            crc_m, size = zlib.crc32(data), len(data)
        else:
            crc_m, size = info
        declared = 1 << 20 if lie and info is not None else size
        offset = len(out)
        zip64 = declared >= 0xFFFFFFFF
        extra = struct.pack("<HHQQ", 1, 16, declared, len(data)) if zip64 else b""
        usize, csize = (0xFFFFFFFF, 0xFFFFFFFF) if zip64 else (declared, len(data))
        out += struct.pack(
            "<4sHHHHHIIIHH", b"PK\x03\x04", 45, 0, method, 0, 0, crc_m, csize, usize, len(n), len(extra)
        )
        out += n + extra + data
        cextra = struct.pack("<HHQQ", 1, 16, declared, len(data)) if zip64 else b""
        central += struct.pack(
            "<4sHHHHHHIIIHHHHHII",
            b"PK\x01\x02",
            45,
            45,
            0,
            method,
            0,
            0,
            crc_m,
            csize,
            usize,
            len(n),
            len(cextra),
            0,
            0,
            0,
            0,
            offset,
        )
        central += n + cextra
    cd_offset = len(out)
    out += central
    out += struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 2, 2, len(central), cd_offset, 0)
    path.write_bytes(bytes(out))


def build_self_list(path: Path) -> None:
    body = b"\x80\x02]q\x00(" + b"h\x00" * 280 + b"e."
    path.write_bytes(body)


def build_billion_laughs(path: Path) -> None:
    out = b"\x80\x02]q\x00."[:-1]  # memo 0: an empty list
    level = 0
    for i in range(1, 10):
        out += b"(" + (b"h" + bytes([level])) * 10 + b"lq" + bytes([i])
        level = i
    path.write_bytes(out + b".")


def build_safetensors(path: Path, n: int = 500_000) -> None:
    header = {
        f"layer.{i}.w": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i in range(n)
    }
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(4 * n))


def build_many_files(folder: Path, n: int = 5000) -> None:
    folder.mkdir()
    small_pickle = pickle.dumps({"step": 1, "loss": 0.5}, protocol=4)
    st_header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    st_header += b" " * (-len(st_header) % 8)
    safetensors = struct.pack("<Q", len(st_header)) + st_header + bytes(8)
    for i in range(n):
        kind = i % 3
        if kind == 0:
            (folder / f"state_{i}.pkl").write_bytes(small_pickle)
        elif kind == 1:
            (folder / f"shard_{i}.safetensors").write_bytes(safetensors)
        else:
            (folder / f"notes_{i}.txt").write_text("hello\n")


SHAPES = {
    "zip_bomb": lambda p: build_zip_bomb(p / "bomb.pt", lie=False) or p / "bomb.pt",
    "zip_bomb_lying_header": lambda p: build_zip_bomb(p / "bomb.pt", lie=True) or p / "bomb.pt",
    "self_list": lambda p: build_self_list(p / "self.pkl") or p / "self.pkl",
    "billion_laughs": lambda p: build_billion_laughs(p / "laughs.pkl") or p / "laughs.pkl",
    "safetensors_500k": lambda p: build_safetensors(p / "wide.safetensors") or p / "wide.safetensors",
    "many_files": lambda p: build_many_files(p / "folder") or p / "folder",
}


REPEATS = 5  # interleaved runs of the scan and of the json.loads baselines (safetensors shape)


def measure(path: Path) -> dict:
    """What the worker does with the file, in this process; returns seconds, RSS and the verdict."""
    from torch_skills.checkpoint.allowlist import Policy
    from torch_skills.checkpoint.contents import find_nonfinite, summarize_tensors
    from torch_skills.checkpoint.load import CheckpointLoadError, load_checkpoint
    from torch_skills.checkpoint.resume import find_resume_roles
    from torch_skills.checkpoint.scan import scan_path
    from torch_skills.checkpoint.verdict import overall_verdict

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    scan = scan_path(path, Policy())
    scanned = time.perf_counter() - started
    scan_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    verdict = overall_verdict(scan)
    if verdict in ("safe", "safe_with_allowlist"):
        try:
            loaded = load_checkpoint(scan)
            if loaded.obj is not None:
                summarize_tensors(loaded.obj)
                find_nonfinite(loaded.obj, loaded.mapped_file, 50)
                find_resume_roles(loaded.obj, folder=loaded.folder)
        except CheckpointLoadError as e:
            verdict += f" (load refused: {str(e)[:60]})"
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    baseline = baseline_nogc = None  # measured last, so its memory does not hide the scan's peak
    if path.suffix == ".safetensors":  # baseline: only parsing the header JSON, what any reader must do
        with open(path, "rb") as f:
            raw = f.read(struct.unpack("<Q", f.read(8))[0])
        # interleave the three REPEATS times: json.loads as it comes, json.loads with the garbage
        # collector paused (the reader pauses it too, so this is the like-for-like floor), the scan;
        # a loaded machine's stalls hit single runs unevenly, so each one's median is compared
        baselines, floors, scans = [], [], [scanned]
        for i in range(REPEATS):
            t0 = time.perf_counter()
            json.loads(raw)
            baselines.append(time.perf_counter() - t0)
            gc.disable()
            t0 = time.perf_counter()
            json.loads(raw)
            floors.append(time.perf_counter() - t0)
            gc.enable()
            if i < REPEATS - 1:
                t0 = time.perf_counter()
                scan_path(path, Policy())
                scans.append(time.perf_counter() - t0)
        baseline, baseline_nogc, scanned = (statistics.median(x) for x in (baselines, floors, scans))
        del raw
    return {
        "seconds": seconds,
        "scan_seconds": scanned,
        "scan_mib": (scan_peak - base) / 1024,
        "peak_mib": (peak - base) / 1024,
        "verdict": verdict,
        "baseline_seconds": baseline,
        "baseline_nogc_seconds": baseline_nogc,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=None)
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        import torch  # noqa: F401 - imported before the baseline, as in the worker

        print(json.dumps(measure(Path(args.measure))))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, build in SHAPES.items():
            if args.only and args.only not in name:
                continue
            folder = Path(tmp) / name
            folder.mkdir()
            path = build(folder)
            size = sum(p.stat().st_size for p in path.rglob("*")) if path.is_dir() else path.stat().st_size
            out = subprocess.run(
                [sys.executable, __file__, "--measure", str(path)],
                capture_output=True,
                text=True,
                timeout=600,
                cwd=REPO_ROOT,
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            )
            if out.returncode != 0:
                rows.append((name, size, None, out.stderr.strip().splitlines()[-1:]))
                continue
            rows.append((name, size, json.loads(out.stdout.strip().splitlines()[-1]), None))
    print(
        f"{'shape':22} {'file bytes':>11} {'scan s':>7} {'scan MiB':>9} {'total s':>8} {'total MiB':>10}  goal  verdict"
    )
    for name, size, r, err in rows:
        if r is None:
            print(f"{name:22} {size:>11} {'-':>7} {'-':>9} {'-':>8} {'-':>10}  NO    crashed: {err}")
            continue
        ok = r["scan_seconds"] < GOAL_SECONDS and r["scan_mib"] < GOAL_MIB
        print(
            f"{name:22} {size:>11} {r['scan_seconds']:>7.2f} {r['scan_mib']:>9.1f} {r['seconds']:>8.2f} "
            f"{r['peak_mib']:>10.1f}  {'yes' if ok else 'NO ':4}  {r['verdict']}"
        )
        if r["baseline_seconds"]:
            print(
                f"{'':22} baseline json.loads of the header alone: {r['baseline_seconds']:.2f} s "
                f"({r['baseline_nogc_seconds']:.2f} s with the garbage collector paused); the scan takes "
                f"{r['scan_seconds'] / r['baseline_seconds']:.2f}x and "
                f"{r['scan_seconds'] / r['baseline_nogc_seconds']:.2f}x that (medians of {REPEATS})"
            )
    print(
        f"goal: the scan of each shape under {GOAL_SECONDS} s and {GOAL_MIB} MiB; total adds loading and the "
        "content analysis of files the scan calls safe (machine shared and loaded; see docstring)"
    )


if __name__ == "__main__":
    main()
