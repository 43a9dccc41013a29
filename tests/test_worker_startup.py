"""How the warm worker starts: ready once torch is in, tool modules loaded while idle, low priority.

Run: `python -m pytest tests/test_worker_startup.py`. The times these choices buy are measured by
bench/startup.py, not here.
"""

from __future__ import annotations

import os

import pytest

from tests.owned import entered_in_own_task
from torch_skills.runner.pool import WorkerPool
from torch_skills.runner.zygote import WORKER_NICE

GATED = "tests.fixtures.gated_preload"


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_a_call_is_served_before_a_slow_tool_module_finishes_preloading(tmp_path, monkeypatch):
    """The worker reports ready after its first preload; a module still loading does not hold calls back."""
    gate = tmp_path / "gate"
    monkeypatch.setenv("TORCH_SKILLS_TEST_GATE", str(gate))
    make = lambda: WorkerPool(max_concurrent=1, preload=("torch_skills.runner.usercode", GATED))  # noqa: E731
    try:
        async with entered_in_own_task(make) as pool:
            pool.prewarm()
            job = await pool.run("tests.fixtures.startup_jobs:worker_state", {}, timeout_s=60)
            gate.touch()
    finally:
        gate.touch()
    assert job.result["gated_preload_loaded"] is False


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_the_worker_and_its_children_run_at_lower_priority():
    """Tool runs are niced by WORKER_NICE, so the worker's torch import never slows the server's handshake."""
    async with entered_in_own_task(lambda: WorkerPool(max_concurrent=1)) as pool:
        job = await pool.run("tests.fixtures.startup_jobs:worker_state", {}, timeout_s=60)
    assert job.result["nice"] == min(19, os.nice(0) + WORKER_NICE)
