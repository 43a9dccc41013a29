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
