"""The warm-worker runner: every way user code can misbehave ends as a clean WorkerError."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from tests.owned import entered_in_own_task
from tests.processes import wait_gone
from torch_skills.runner.errors import WorkerError
from torch_skills.runner.pool import WorkerPool

JOBS = "tests.fixtures.jobs"


def _prewarmed_pool() -> WorkerPool:
    return WorkerPool(max_concurrent=2, preload=(JOBS,))


@pytest.fixture(scope="module")
async def pool() -> AsyncIterator[WorkerPool]:
    async with entered_in_own_task(_prewarmed_pool) as pool:
        pool.prewarm()
        yield pool


async def test_a_call_returns_its_result_and_what_the_code_printed(pool: WorkerPool, capfd):
    """The result comes back as data; the print goes into the result, never to our stdout."""
    job = await pool.run(f"{JOBS}:echo", {"x": 1}, timeout_s=30)
    assert job.result["echo"] == {"x": 1} and job.result["sum"] == 4.0
    assert "hello from the child" in job.output
    assert job.device == "cpu" and job.torch_version
    assert "hello from the child" not in capfd.readouterr().out


async def test_each_call_runs_in_a_fresh_process_without_state_from_earlier_calls(pool: WorkerPool):
    """Module globals set by one call are gone in the next."""
    first = await pool.run(f"{JOBS}:remember", {}, timeout_s=30)
    second = await pool.run(f"{JOBS}:remember", {}, timeout_s=30)
    assert first.result["seen"] == second.result["seen"] == 1


async def test_progress_reported_in_the_worker_reaches_the_callback(pool: WorkerPool):
    """job.progress() lines are relayed while the call runs."""
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, total, message))

    await pool.run(f"{JOBS}:report_progress", {"steps": 4}, timeout_s=30, on_progress=on_progress)
    assert seen and seen[0] == (1.0, 4, "step 1")
    assert [s[0] for s in seen] == sorted(s[0] for s in seen)


@pytest.mark.parametrize(
    ("fn", "kind", "text"),
    [
        ("segfault", "crash", "SIGSEGV"),
        ("call_os_exit", "crash", "exited with code 7"),
        ("call_sys_exit", "sys_exit", "sys.exit(3)"),
        ("raise_value_error", "user_exception", "bad shapes in my model"),
        ("allocate_huge", "out_of_memory", "smaller batch"),
    ],
)
async def test_a_crash_exit_or_exception_becomes_a_worker_error_that_names_it(
    pool: WorkerPool, fn: str, kind: str, text: str
):
    """Each failure mode has its own kind and a message with the next step."""
    with pytest.raises(WorkerError) as err:
        await pool.run(f"{JOBS}:{fn}", {}, timeout_s=30, memory_limit_bytes=4 << 30)
    assert err.value.kind == kind
    assert text in str(err.value)


async def test_a_segfault_keeps_the_python_traceback_of_where_it_died(pool: WorkerPool):
    """faulthandler output is part of the captured output."""
    with pytest.raises(WorkerError) as err:
        await pool.run(f"{JOBS}:segfault", {}, timeout_s=30)
    assert "about to crash" in err.value.output
    assert "jobs.py" in err.value.output


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_a_hang_is_stopped_at_the_timeout_and_its_process_killed(pool: WorkerPool, tmp_path: Path):
    """An endless loop ends as a timeout error and leaves no process behind."""
    pid_file = tmp_path / "pid"
    with pytest.raises(WorkerError) as err:
        await pool.run(f"{JOBS}:write_pid_then_hang", {"pid_file": str(pid_file)}, timeout_s=2)
    assert err.value.kind == "timeout"
    assert await wait_gone(int(pid_file.read_text()))


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_processes_the_user_code_started_die_with_its_call(pool: WorkerPool, tmp_path: Path):
    """Leftover children (DataLoader workers, subprocesses) are killed with the job's process group."""
    job = await pool.run(f"{JOBS}:spawn_grandchild", {}, timeout_s=30)
    assert await wait_gone(job.result["grandchild"])
    pid_file = tmp_path / "grandchild"
    with pytest.raises(WorkerError):
        await pool.run(f"{JOBS}:spawn_grandchild", {"hang": True, "pid_file": str(pid_file)}, timeout_s=2)
    assert await wait_gone(int(pid_file.read_text()))


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_a_cancelled_call_kills_its_process(pool: WorkerPool, tmp_path: Path):
    """Client cancellation reaches the worker child."""
    pid_file = tmp_path / "pid"
    with anyio.move_on_after(2):
        await pool.run(f"{JOBS}:write_pid_then_hang", {"pid_file": str(pid_file)}, timeout_s=60)
    assert await wait_gone(int(pid_file.read_text()))


async def test_memory_beyond_the_limit_stops_the_call_with_a_memory_error(pool: WorkerPool):
    """Touching more RAM than memory_limit_bytes ends as out_of_memory, not a dead machine."""
    with pytest.raises(WorkerError) as err:
        await pool.run(f"{JOBS}:touch_memory", {}, timeout_s=60, memory_limit_bytes=1 << 30)
    assert err.value.kind == "out_of_memory"


async def test_print_spam_is_captured_head_and_tail_within_a_bound(pool: WorkerPool):
    """Megabytes of output cost bounded memory; the end of the output is kept."""
    job = await pool.run(f"{JOBS}:print_spam", {}, timeout_s=60)
    assert job.output_bytes > 40_000_000
    assert job.output_truncated
    assert len(job.output) < 64_000
    assert job.output.rstrip().endswith("the end of the spam")


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_at_most_max_concurrent_calls_run_at_once_and_the_rest_queue(pool: WorkerPool):
    """With two slots, a third call starts only after one of the first two ends."""
    results = []

    async def one() -> None:
        results.append((await pool.run(f"{JOBS}:sleep_and_stamp", {"seconds": 1.0}, timeout_s=30)).result)

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(one)
    results.sort(key=lambda r: r["started"])
    assert results[2]["started"] >= min(results[0]["ended"], results[1]["ended"]) - 0.05
    assert results[1]["started"] < results[0]["ended"]  # the first two overlapped


async def test_the_warm_worker_is_restarted_after_it_dies(pool: WorkerPool):
    """Killing the warm worker costs one restart, not the server."""
    await pool.run(f"{JOBS}:echo", {}, timeout_s=60)  # the worker is up, whatever ran before
    worker_pid = pool.worker_info["pid"]
    os.kill(worker_pid, signal.SIGKILL)
    assert await wait_gone(worker_pid)
    job = await pool.run(f"{JOBS}:echo", {}, timeout_s=60)
    assert job.result["sum"] == 4.0
    assert pool.worker_info["pid"] != worker_pid


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_the_warm_worker_stays_single_threaded_after_preloading_every_tool():
    """fork() is only safe from one thread: no preload or warm_up may leave threads (OpenMP, ...) behind."""
    from torch_skills.server import WORKER_PRELOAD

    async with WorkerPool(preload=WORKER_PRELOAD) as pool:
        await pool.run(f"{JOBS}:echo", {}, timeout_s=120)
        assert len(os.listdir(f"/proc/{pool.worker_info['pid']}/task")) == 1


async def test_progress_from_a_call_that_ends_before_the_first_poll_still_arrives(pool: WorkerPool):
    """The relay reads the progress file once more after the job exits, so no line is lost."""
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, total, message))

    await pool.run(f"{JOBS}:echo", {}, timeout_s=30, on_progress=on_progress)
    assert seen == [(1.0, 2, "half way")]
