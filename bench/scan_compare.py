"""Detections, misses and false alarms: verify_checkpoint's static scan next to picklescan, fickling, modelscan, modelaudit.

Run from the repository root:

    python bench/scan_compare.py                          # installs the peers into a temporary folder
    python bench/scan_compare.py --scanners-dir /tmp/scanners --out bench/results/scan_compare.md
    python bench/scan_compare.py --scanners-python /path/to/venv/bin/python   # peers in their own venv

Samples: the test corpus (tests/fixtures/checkpoint_corpus.py: live payloads, each proven to run
when loaded the usual way, and benign checkpoints of every supported kind) plus
bench/public_corpus.py (attack families regenerated from the public test suites of picklescan,
fickling and modelscan, known bypasses, and benign files written by torch, numpy, safetensors,
transformers, accelerate and DCP when installed) plus bench/parity_corpus.py (containers a naive
reader reads differently from their loader: object dtypes spelled other ways, torch zips read as
torch's miniz reader reads them, DCP items, .pt2 members, legacy and v7 tars, joblib arrays).
Bypasses described in public reports (bench/published_bypasses.py) are tallied apart.
A malicious sample counts as detected when the scanner does not call it safe: ours, when the
verdict is unsafe or corrupt; picklescan, when it reports a dangerous global; fickling, when
`is_likely_safe` is false (or it fails); modelscan, when it lists an issue; modelaudit, when it
reports a critical issue (with warnings counted too, 0.2.54 flags 32 of the 50 benign files). A benign sample flagged that way is a false alarm (TorchScript and pickled
whole modules are allowed to be flagged; none are in the benign set). Scanner errors are counted
apart and, for a malicious sample, an error without a finding is a miss.

The peers are the optional extra `scanners` (`pip install picklescan fickling modelscan
modelaudit`); each runs in its own child process, with the install folder on its path or under
the interpreter of its own virtual environment (`--scanners-python`), so its dependencies never
mix with this process's; telemetry is switched off through the environment. Missing peers are skipped with a note. Times are for the whole sample set in
one process per scanner (imports excluded), on a shared, loaded machine: compare within one run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
import server  # noqa: E402,F401  (registers torch_skills from this clone)
from bench.parity_corpus import build_parity_corpus  # noqa: E402
from bench.public_corpus import build_public_corpus  # noqa: E402
from bench.published_bypasses import build_published_bypasses  # noqa: E402
from tests.fixtures.checkpoint_corpus import build_corpus  # noqa: E402

PEERS = ("picklescan", "fickling", "modelscan", "modelaudit")

# Runs in a child process: python -c DRIVER SCANNER PATHS.json OUT.json
DRIVER = r"""
import json, sys, time, logging, os
from pathlib import Path
logging.disable(logging.CRITICAL)
scanner, paths, out = sys.argv[1], json.loads(Path(sys.argv[2]).read_text()), sys.argv[3]

def files(p):
    p = Path(p)
    return [f for f in sorted(p.rglob("*")) if f.is_file()] if p.is_dir() else [p]

if scanner == "picklescan":
    from picklescan import scanner as ps
    def scan(p):
        r = ps.scan_directory_path(p) if Path(p).is_dir() else ps.scan_file_path(p)
        return r.issues_count > 0, bool(r.scan_err)
elif scanner == "fickling":
    import fickling
    def scan(p):
        flagged, err = False, False
        for f in files(p):
            try:
                flagged |= not fickling.is_likely_safe(str(f))
            except Exception:
                err = True
        return flagged, err
elif scanner == "modelscan":
    from modelscan.modelscan import ModelScan
    def scan(p):
        r = ModelScan().scan(p)
        return bool(r.get("issues")), bool(r.get("errors"))
elif scanner == "modelaudit":
    from modelaudit.core import scan_model_directory_or_file
    def scan(p):
        r = scan_model_directory_or_file(str(p))
        sev = [str(getattr(i, "severity", "")).lower().rsplit(".", 1)[-1] for i in r.issues]
        return "critical" in sev, bool(r.has_errors)
results, started = {}, time.perf_counter()
for p in paths:
    try:
        results[p] = scan(p)
    except Exception as e:
        results[p] = (False, True)
Path(out).write_text(json.dumps({"results": results, "seconds": time.perf_counter() - started}))
"""


@dataclass
class Tally:
    name: str
    detected: int = 0
    errors: int = 0
    false_alarms: int = 0
    missed: list[str] = field(default_factory=list)
    alarms: list[str] = field(default_factory=list)
    seconds: float = 0.0
    by_family: dict[str, list[int]] = field(default_factory=dict)  # family -> [detected, total]


def ours(paths: list[str]) -> tuple[dict[str, tuple[bool, bool]], float]:
    from torch_skills.checkpoint.scan import scan_path
    from torch_skills.checkpoint.verdict import overall_verdict

    results, started = {}, time.perf_counter()
    for p in paths:
        verdict = overall_verdict(scan_path(p))
        results[p] = (verdict in ("unsafe", "corrupt"), False)
    return results, time.perf_counter() - started


def install_peers(target: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--target",
        str(target),
        *PEERS,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        print(f"peers could not be installed ({done.stderr.strip()[-300:]})")


NO_TELEMETRY = {"DO_NOT_TRACK": "1", "PROMPTFOO_DISABLE_TELEMETRY": "1", "MODELAUDIT_DISABLE_TELEMETRY": "1"}


def run_peer(
    name: str, paths: list[str], scanners_dir: Path | None, tmp: Path, python: str | None = None
) -> tuple[dict, float] | None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp), **NO_TELEMETRY}
    if python is not None:
        found = subprocess.run([python, "-c", f"import {name}"], capture_output=True, env=env, timeout=300)
        if found.returncode != 0:
            print(f"{name} is not installed for {python}; skipped")
            return None
    elif scanners_dir is None or not (scanners_dir / name).exists():
        print(f"{name} is not installed in {scanners_dir}; skipped")
        return None
    else:
        env["PYTHONPATH"] = str(scanners_dir)
    listing, out = tmp / f"{name}-paths.json", tmp / f"{name}-out.json"
    listing.write_text(json.dumps(paths))
    done = subprocess.run(
        [python or sys.executable, "-c", DRIVER, name, str(listing), str(out)],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    if done.returncode != 0 or not out.exists():
        print(f"{name} failed to run: {done.stderr.strip()[-400:]}")
        return None
    data = json.loads(out.read_text())
    return {p: tuple(v) for p, v in data["results"].items()}, data["seconds"]


def tally(name: str, results: dict, seconds: float, malicious: list, benign: list) -> Tally:
    t = Tally(name, seconds=seconds)
    for family, label, path in malicious:
        flagged, error = results[str(path)]
        t.errors += error
        t.detected += flagged
        fam = t.by_family.setdefault(family, [0, 0])
        fam[0] += flagged
        fam[1] += 1
        if not flagged:
            t.missed.append(label)
    for _, label, path in benign:
        flagged, error = results[str(path)]
        t.errors += error
        if flagged:
            t.false_alarms += 1
            t.alarms.append(label)
    return t


def render(tallies: list[Tally], malicious: list, benign: list) -> str:
    n_bad, n_good = len(malicious), len(benign)
    families = sorted({f for f, _, _ in malicious})
    lines = [
        f"Samples: {n_bad} malicious in {len(families)} families, {n_good} benign files/folders.",
        "",
        "| scanner | detected | missed | false alarms | scanner errors | seconds (all samples) |",
        "|---|---|---|---|---|---|",
    ]
    for t in tallies:
        lines.append(
            f"| {t.name} | {t.detected}/{n_bad} | {n_bad - t.detected} | {t.false_alarms}/{n_good} | {t.errors} | {t.seconds:.1f} |"
        )
    lines += ["", "| family | " + " | ".join(t.name for t in tallies) + " |", "|---|" + "---|" * len(tallies)]
    for fam in families:
        cells = " | ".join(f"{t.by_family[fam][0]}/{t.by_family[fam][1]}" for t in tallies)
        lines.append(f"| {fam} | {cells} |")
    lines.append("")
    for t in tallies:
        lines.append(f"{t.name} missed: {', '.join(t.missed) or 'none'}")
        lines.append(f"{t.name} false alarms: {', '.join(t.alarms) or 'none'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--scanners-dir", type=Path, default=None, help="where picklescan/fickling/modelscan are installed"
    )
    p.add_argument(
        "--scanners-python", default=None, help="the python of a virtual environment holding the peers"
    )
    p.add_argument("--out", type=Path, default=None, help="also write the tables to this file")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="scan-compare-") as tmp_name:
        tmp = Path(tmp_name)
        corpus = build_corpus(tmp / "corpus")
        public_bad, public_good = build_public_corpus(tmp / "public")
        parity_bad, parity_good = build_parity_corpus(tmp / "parity")
        malicious = (
            [(f"test corpus: {s.family}", s.name, s.path) for s in corpus.malicious] + public_bad + parity_bad
        )
        benign = [("test corpus", s.name, s.path) for s in corpus.benign] + public_good + parity_good
        published = build_published_bypasses(tmp / "published")
        paths = [str(path) for _, _, path in malicious + benign + published]
        scanners_dir = args.scanners_dir
        if scanners_dir is None and args.scanners_python is None:
            scanners_dir = tmp / "scanners"
            install_peers(scanners_dir)
        results, seconds = ours(paths)
        tallies = [tally("verify_checkpoint", results, seconds, malicious, benign)]
        apart = [tally("verify_checkpoint", results, 0.0, published, [])]
        for name in PEERS:
            got = run_peer(name, paths, scanners_dir, tmp, args.scanners_python)
            if got is not None:
                tallies.append(tally(name, got[0], got[1], malicious, benign))
                apart.append(tally(name, got[0], 0.0, published, []))
        text = render(tallies, malicious, benign)
        text += "\n\nPublished bypasses (bench/published_bypasses.py, collected after the techniques above were built):\n"
        text += "\n".join(
            f"{t.name}: {t.detected}/{len(published)} (missed: {', '.join(t.missed) or 'none'})"
            for t in apart
        )
        text += f"\nNo test-corpus payload ran during the scans: {not any(s.executed() for s in corpus.malicious)}"
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
