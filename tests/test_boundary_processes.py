"""Abuse matrix, processes and limits: nothing a job starts outlives it, waiting counts, memory adds up."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from tests.owned import entered_in_own_task
from tests.processes import wait_gone
from torch_skills.runner.errors import WorkerError
from torch_skills.runner.pool import WorkerPool, default_memory_limit_bytes, memory_budget_bytes

BOUNDARY = "tests.fixtures.boundary_jobs"
JOBS = "tests.fixtures.jobs"


@pytest.fixture(scope="module")
async def pool() -> AsyncIterator[WorkerPool]:
    async with entered_in_own_task(lambda: WorkerPool(max_concurrent=2, preload=(BOUNDARY, JOBS))) as pool:
        pool.prewarm()
        yield pool


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_a_grandchild_in_a_new_session_dies_when_its_call_returns(pool: WorkerPool, tmp_path: Path):
    """start_new_session=True leaves the job's process group; the job's tree still takes it down."""
    pid_file = tmp_path / "pid"
    job = await pool.run(f"{BOUNDARY}:setsid_grandchild", {"pid_file": str(pid_file)}, timeout_s=30)
    assert await wait_gone(job.result["grandchild"])


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_a_grandchild_in_a_new_session_dies_when_its_call_times_out(pool: WorkerPool, tmp_path: Path):
    """A job killed at its timeout takes its setsid() descendants with it."""
    pid_file = tmp_path / "pid"
    with pytest.raises(WorkerError) as err:
        await pool.run(
            f"{BOUNDARY}:setsid_grandchild", {"pid_file": str(pid_file), "hang": True}, timeout_s=3
        )
    assert err.value.kind == "timeout"
    assert await wait_gone(int(pid_file.read_text()))


async def test_a_double_forked_daemon_dies_with_its_call(pool: WorkerPool, tmp_path: Path):
    """A process orphaned while the job runs (its parent exited) is still the job's and dies with it."""
    pid_file = tmp_path / "pid"
    job = await pool.run(f"{BOUNDARY}:double_fork_daemon", {"pid_file": str(pid_file)}, timeout_s=30)
    assert await wait_gone(job.result["daemon"])


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_time_waiting_for_a_free_worker_counts_toward_the_timeout_and_is_reported(pool: WorkerPool):
    """With both workers busy, a third call hears it is waiting and times out within its own timeout_s."""
    messages: list[str] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    async def busy() -> None:
        await pool.run(f"{JOBS}:sleep_and_stamp", {"seconds": 4.0}, timeout_s=30)

    async with anyio.create_task_group() as tg:
        tg.start_soon(busy)
        tg.start_soon(busy)
        await anyio.sleep(0.5)
        started = time.monotonic()
        with pytest.raises(WorkerError) as err:
            await pool.run(f"{JOBS}:echo", {}, timeout_s=1.5, on_progress=on_progress)
        waited = time.monotonic() - started
    assert err.value.kind == "timeout" and "waiting" in str(err.value)
    assert waited < 3.5  # not 1.5 s of wait plus 1.5 s of run
    assert any(m.startswith("waiting for a free worker (") and "ahead" in m for m in messages)


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_memory_caps_of_running_jobs_never_add_up_to_more_than_the_budget():
    """Two jobs whose caps together exceed the budget run one after the other, not together."""
    budget = 3 << 30
    async with WorkerPool(max_concurrent=2, preload=(JOBS,), memory_budget=budget) as pool:
        stamps = []

        async def one() -> None:
            job = await pool.run(
                f"{JOBS}:sleep_and_stamp", {"seconds": 1.0}, timeout_s=60, memory_limit_bytes=2 << 30
            )
            stamps.append(job.result)

        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
            tg.start_soon(one)
        stamps.sort(key=lambda r: r["started"])
        assert stamps[1]["started"] >= stamps[0]["ended"] - 0.05
        with pytest.raises(WorkerError) as err:
            await pool.run(f"{JOBS}:echo", {}, timeout_s=30, memory_limit_bytes=4 << 30)
        assert err.value.kind == "bad_request" and "memory_limit_gib" in str(err.value)


def test_the_default_caps_of_max_jobs_jobs_fit_in_the_machine():
    """The default per-job cap times the number of concurrent jobs stays within the machine's budget."""
    for jobs in (1, 2, 3, 8):
        assert default_memory_limit_bytes(jobs) * jobs <= memory_budget_bytes()
