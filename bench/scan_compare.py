"""Detection, false alarms and scan speed: verify_checkpoint's static scan next to picklescan.

Run from the repository root:

    python bench/scan_compare.py                # corpus + two large files, 5 timing repeats
    python bench/scan_compare.py --repeat 3 --large-mib 64 --out bench/results/scan_compare.md

It builds the test corpus (tests/fixtures/checkpoint_corpus.py: malicious samples, each of which
would change a sentinel file if loaded, and benign checkpoints of every supported kind) in a
temporary folder, installs picklescan from PyPI into another temporary folder with
`pip install --target` (it is not a project dependency), and scans every sample with both tools
in this one process. A malicious sample counts as detected when the tool reports it unsafe
(ours: `safe` is false; picklescan: at least one dangerous global, with and without --strict;
its scan errors are counted apart). A benign sample flagged the same way is a false alarm.
Throughput is total bytes over the median wall time of `--repeat` full passes; the large-file
table shows what each tool costs on a big torch zip and a big plain pickle of numpy arrays.

Only the static scan is timed for our tool (torch_skills.checkpoint.scan.scan_path), the part that
compares with picklescan; verify_checkpoint also loads safe files and checks their contents.
If picklescan cannot be installed (no network), the script says so and reports our numbers alone.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from tests.fixtures.checkpoint_corpus import Corpus, build_corpus  # noqa: E402
from torch_skills.checkpoint.scan import scan_path  # noqa: E402

Scanner = Callable[[Path], tuple[bool, bool]]  # path -> (flagged, scan error)


@dataclass
class Tally:
    name: str
    detected: int = 0
    detected_or_error: int = 0
    false_alarms: int = 0
    errors: int = 0
    missed: list[str] = field(default_factory=list)
    alarms: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)


def size_of(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def ours(path: Path) -> tuple[bool, bool]:
    return (not scan_path(path).safe, False)


def install_picklescan(target: Path):
    """picklescan.scanner from a private --target install, or None with the reason printed."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--target",
        str(target),
        "picklescan",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        print(
            f"picklescan could not be installed ({done.stderr.strip()[-300:]}); reporting verify_checkpoint only."
        )
        return None, None
    sys.path.insert(0, str(target))
    scanner = importlib.import_module("picklescan.scanner")
    version = next(
        (p.name.removesuffix(".dist-info").split("-")[1] for p in target.glob("picklescan-*.dist-info")), "?"
    )
    logging.getLogger("picklescan").setLevel(logging.CRITICAL)
    return scanner, version


def picklescan_scanner(module, strict: bool) -> Scanner:
    def scan(path: Path) -> tuple[bool, bool]:
        try:
            if path.is_dir():
                result = module.scan_directory_path(str(path), strict=strict)
            else:
                result = module.scan_file_path(str(path), strict=strict)
        except Exception:  # a crash on a hostile file is an error, not a detection
            return False, True
        return result.issues_count > 0, bool(result.scan_err)

    return scan


def tally(name: str, scan: Scanner, corpus: Corpus, repeat: int) -> Tally:
    t = Tally(name)
    for sample in corpus.samples:
        flagged, error = scan(sample.path)
        t.errors += error
        if sample.malicious:
            t.detected += flagged
            t.detected_or_error += flagged or error
            if not flagged:
                t.missed.append(sample.name)
        elif flagged:
            t.false_alarms += 1
            t.alarms.append(sample.name)
    for _ in range(repeat):
        start = time.perf_counter()
        for sample in corpus.samples:
            scan(sample.path)
        t.seconds.append(time.perf_counter() - start)
    return t


def large_files(folder: Path, mib: int) -> list[tuple[str, Path]]:
    """A big torch.save zip and a big protocol-4 pickle of numpy arrays (both benign)."""
    import numpy as np
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    n = max(1, mib // 4)
    zip_path = folder / "large_state_dict.pt"
    torch.save({f"layer{i}.weight": torch.zeros(1024, 1024) for i in range(n)}, zip_path)  # 4 MiB each
    pkl_path = folder / "large_numpy.pkl"
    pkl_path.write_bytes(
        pickle.dumps({f"a{i}": np.zeros((1024, 1024), dtype=np.float32) for i in range(n)}, protocol=4)
    )
    return [("torch zip", zip_path), ("numpy pickle", pkl_path)]


def time_one(scan: Scanner, path: Path, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        scan(path)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def render(
    corpus: Corpus, tallies: list[Tally], large: list[tuple[str, Path, list[float]]], names: list[str]
) -> str:
    n_bad, n_good = len(corpus.malicious), len(corpus.benign)
    total = sum(size_of(s.path) for s in corpus.samples)
    lines = [
        f"Corpus: {n_bad} malicious samples ({len({s.family for s in corpus.malicious})} families), "
        f"{n_good} benign checkpoints, {total / 2**20:.2f} MiB, {len(corpus.samples)} paths.",
        "",
        "| scanner | detected | detection rate | incl. scan errors | false alarms | false-alarm rate | scan errors | corpus scan (median) | MiB/s | paths/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in tallies:
        median = statistics.median(t.seconds)
        lines.append(
            f"| {t.name} | {t.detected}/{n_bad} | {t.detected / n_bad:.1%} | {t.detected_or_error}/{n_bad} | "
            f"{t.false_alarms}/{n_good} | {t.false_alarms / n_good:.1%} | {t.errors} | {median * 1e3:.1f} ms | "
            f"{total / 2**20 / median:.1f} | {len(corpus.samples) / median:.0f} |"
        )
    base = statistics.median(tallies[0].seconds)
    lines.append("")
    for t in tallies[1:]:
        ratio = base / statistics.median(t.seconds)
        lines.append(f"verify_checkpoint takes {ratio:.2f}x the corpus scan time of {t.name}.")
    if large:
        lines += ["", "| large file | size | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
        for label, path, seconds in large:
            cells = " | ".join(f"{s * 1e3:.1f} ms ({size_of(path) / 2**20 / s:.0f} MiB/s)" for s in seconds)
            lines.append(f"| {label} | {size_of(path) / 2**20:.0f} MiB | {cells} |")
    lines.append("")
    for t in tallies:
        lines.append(f"{t.name} missed: {', '.join(t.missed) or 'none'}")
        lines.append(f"{t.name} false alarms: {', '.join(t.alarms) or 'none'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=5, help="timing passes (the median is reported)")
    p.add_argument("--large-mib", type=int, default=256, help="size of each large file; 0 skips them")
    p.add_argument("--out", type=Path, default=None, help="also write the tables to this file")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="scan-compare-") as tmp:
        corpus = build_corpus(Path(tmp) / "corpus")
        module, version = install_picklescan(Path(tmp) / "picklescan")
        scanners: list[tuple[str, Scanner]] = [("verify_checkpoint", ours)]
        if module is not None:
            scanners += [
                (f"picklescan {version}", picklescan_scanner(module, strict=False)),
                (f"picklescan {version} --strict", picklescan_scanner(module, strict=True)),
            ]
        tallies = [tally(name, scan, corpus, args.repeat) for name, scan in scanners]
        untouched = not any(s.executed() for s in corpus.malicious)
        large = []
        if args.large_mib > 0:
            for label, path in large_files(Path(tmp) / "large", args.large_mib):
                large.append((label, path, [time_one(scan, path, args.repeat) for _, scan in scanners]))
        text = render(corpus, tallies, large, [name for name, _ in scanners])
        text += f"\nNo payload ran during the scans (every sentinel untouched): {untouched}"
        text += f"\nPython {sys.version.split()[0]}, {os.cpu_count()} CPUs; times are medians of {args.repeat} passes."
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
