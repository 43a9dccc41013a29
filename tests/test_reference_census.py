"""Property: across every installed distribution, the rule admits only nn.Module subclasses and listed factories.

tests/reference_census.py draws every public callable of every installed distribution's modules
(about 14,500 here) and asks the worker's admission check about each in every role, under a profile
hook: nothing is admitted that the independent oracle does not allow, and no candidate's code nor
any third-party frame runs while asking.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # imports every installed package: about 30 s of CPU
def test_no_installed_callable_is_admitted_unless_it_is_a_module_class_or_a_listed_factory():
    """Every public callable of every installed distribution, every role: only what the rule allows, none called."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "tools"), str(REPO)]))
    done = subprocess.run(
        [sys.executable, "-m", "tests.reference_census"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    census = json.loads(done.stdout.strip().splitlines()[-1])
    assert census["imported_top_level"] >= 20 and census["callables"] >= 1000, census
    assert census["wrongly_admitted"] == [], census["wrongly_admitted"]
    assert census["candidate_code_entered"] == [], census["candidate_code_entered"]
    assert census["third_party_frames_entered"] == [], census["third_party_frames_entered"]
    assert census["admitted"]["model"] > 0 and census["admitted"]["loss"] > 0  # the oracle's positives exist
    assert census["admitted"]["inputs"] == census["admitted"]["data"] == census["admitted"]["function"] == 0
