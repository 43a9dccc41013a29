"""A job cannot starve the server: progress floods, shared memory and huge files stay bounded."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from tests.owned import entered_in_own_task
from torch_skills.runner.errors import WorkerError
from torch_skills.runner.pool import ProgressReader, WorkerPool

JOBS = "tests.fixtures.jobs"
_PAGE = os.sysconf("SC_PAGE_SIZE")


@pytest.fixture(scope="module")
async def pool() -> AsyncIterator[WorkerPool]:
    async with entered_in_own_task(lambda: WorkerPool(max_concurrent=2, preload=(JOBS,))) as pool:
        pool.prewarm()
        yield pool


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def test_the_progress_reader_reads_a_bounded_amount_and_keeps_the_newest_complete_reports(tmp_path: Path):
    """A flood is skipped to its last max_bytes, at most max_lines are kept; a line cut in half waits for its end."""
    path = tmp_path / "progress.jsonl"
    reader = ProgressReader(path, max_bytes=1024, max_lines=2)
    assert reader.poll() == []  # no file yet
    path.write_bytes(b'{"progress": 1, "total": 4, "message": "one"}\n{"progress": 2, "tot')
    assert reader.poll() == [(1.0, 4.0, "one")]
    with open(path, "ab") as f:
        f.write(b'al": 4, "message": "two"}\n')
    assert reader.poll() == [(2.0, 4.0, "two")]
    with open(path, "ab") as f:
        f.write(b"y" * 100_000)  # one endless line, longer than a read
    assert reader.poll() == []
    with open(path, "ab") as f:
        f.write(b"\n" + b"".join(b'{"progress": %d, "total": 9}\n' % i for i in range(3, 9)))
    assert reader.poll() == [(7.0, 9.0, None), (8.0, 9.0, None)]
    assert reader.offset == path.stat().st_size


@pytest.mark.slow  # writes 512 MiB: about 10 s; the reader's bounds are checked in the quick set above
async def test_a_flooded_progress_file_neither_grows_the_server_nor_stalls_its_event_loop(pool: WorkerPool):
    """512 MiB of progress in one line: server RSS stays flat, the loop keeps ticking, the last report arrives."""
    await pool.run(f"{JOBS}:echo", {}, timeout_s=120)  # the worker is warm before measuring
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, total, message))

    baseline, peak, stop = _rss(), [0], threading.Event()

    def sample() -> None:  # a thread, so the samples go on even while the loop is blocked
        while not stop.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    worst_lag, running = 0.0, True

    async def tick() -> None:
        nonlocal worst_lag
        while running:
            before = time.monotonic()
            await anyio.sleep(0.01)
            worst_lag = max(worst_lag, time.monotonic() - before - 0.01)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(tick)
            await pool.run(f"{JOBS}:flood_progress", {"mib": 512}, timeout_s=120, on_progress=on_progress)
            running = False
    finally:
        stop.set()
        sampler.join()
    assert seen and seen[-1] == (7.0, 8.0, "after the flood")
    assert peak[0] - baseline < 64 << 20, f"server RSS grew {(peak[0] - baseline) >> 20} MiB"
    assert worst_lag < 1.0, f"the event loop stalled {worst_lag:.2f} s"  # the old relay: seconds


async def test_shared_memory_held_in_a_memfd_counts_against_the_memory_limit(pool: WorkerPool):
    """A memfd of three times the cap (no RSS at all) ends the call with the memory error."""
    limit = 512 << 20
    with pytest.raises(WorkerError) as err:
        await pool.run(f"{JOBS}:fill_memfd", {"bytes": 3 * limit}, timeout_s=60, memory_limit_bytes=limit)
    assert err.value.kind == "out_of_memory"
    assert "memory_limit_gib=0.5" in str(err.value)


async def test_a_file_written_past_the_size_limit_is_a_clear_error_naming_the_limit(
    pool: WorkerPool, tmp_path: Path
):
    """RLIMIT_FSIZE stops the write with EFBIG, reported with the limit, not a bare SIGXFSZ crash."""
    target = tmp_path / "big.bin"
    with pytest.raises(WorkerError) as err:
        await pool.run(
            f"{JOBS}:write_file",
            {"path": str(target), "mib": 32},
            timeout_s=60,
            file_size_limit_bytes=8 << 20,
        )
    assert err.value.kind == "file_too_large"
    assert "8 MiB" in str(err.value) and "SIGXFSZ" not in str(err.value)
    assert target.stat().st_size <= 8 << 20
    job = await pool.run(f"{JOBS}:write_file", {"path": str(target), "mib": 4}, timeout_s=60)
    assert job.result == {"written": 4}  # the default limit lets ordinary files through
