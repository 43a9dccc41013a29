"""The benchmark scripts stay runnable: each one's imports resolve from a clone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
def test_every_bench_script_imports_from_a_clone():
    """Loading each bench/*.py (without running its main) finds torch_skills and its own helpers."""
    scripts = sorted(p.name for p in (REPO / "bench").glob("*.py"))
    code = (
        "import runpy, sys\n"
        "for name in sys.argv[1:]:\n"
        "    runpy.run_path(f'bench/{name}', run_name='bench_import_check')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *scripts], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow  # a CPU dry run of the device script: about 20 s
def test_the_gpu_check_dry_run_measures_every_phase_it_is_given_on_a_small_budget(tmp_path):
    """gpu_check.py --dry on the CPU runs the phases in the order asked, each within its share of a
    60 s budget, and writes the JSON, the table and the tests' log (its first cut gave the memory
    phase no time to start a case on a budget this small)."""
    import json

    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--dry", "--out", str(tmp_path),
         "--phases", "tests,memory,profile", "--budget-s", "60"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [r.get("error") for r in report["memory"]] == [None, None, None]
    assert [r.get("error") for r in report["profile"]] == [None]
    assert report["gpu_tests"]["status"] == "exit 0"  # every GPU test skips on the CPU
    assert (tmp_path / "gpu_tests.log").stat().st_size > 0 and (tmp_path / "gpu_check.md").exists()
