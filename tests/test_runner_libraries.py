"""Installed libraries a call imports are imported once in the warm worker, never at fork's expense."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from tests.owned import entered_in_own_task
from torch_skills.runner.pool import WorkerPool

JOBS = "tests.fixtures.jobs"


@pytest.fixture
def site(tmp_path: Path, monkeypatch) -> Path:
    """A site-packages folder on the worker's path with a plain library and one that starts a thread."""
    folder = tmp_path / "site-packages"
    (folder / "plainlib").mkdir(parents=True)
    (folder / "plainlib" / "__init__.py").write_text("VALUE = 1\n")
    (folder / "plainlib" / "sub.py").write_text("from plainlib import VALUE\n")
    (folder / "threadlib").mkdir()
    (folder / "threadlib" / "__init__.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")]))
    return folder


async def _call_until(pool: WorkerPool, module: str, want_had: bool, tries: int = 20) -> dict:
    result: dict = {}
    for _ in range(tries):
        result = (await pool.run(f"{JOBS}:import_library", {"module": module}, timeout_s=60)).result
        if result["had"] == want_had:
            return result
        await anyio.sleep(0.3)  # the warm worker imports when idle
    return result


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_a_library_the_last_call_imported_is_already_there_for_the_next(site: Path):
    """plainlib.sub is imported by call one; a later call finds it in the warm worker, which stays single-threaded."""
    async with entered_in_own_task(lambda: WorkerPool()) as pool:
        first = (await pool.run(f"{JOBS}:import_library", {"module": "plainlib.sub"}, timeout_s=60)).result
        assert first["had"] is False
        later = await _call_until(pool, "plainlib.sub", want_had=True)
        assert later["had"] is True
        assert len(os.listdir(f"/proc/{pool.worker_info['pid']}/task")) == 1


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_a_library_that_starts_a_thread_is_never_preloaded(site: Path):
    """threadlib leaves a thread: the warm worker restarts without it and later calls import it themselves."""
    async with entered_in_own_task(lambda: WorkerPool()) as pool:
        await pool.run(f"{JOBS}:import_library", {"module": "threadlib"}, timeout_s=60)
        for _ in range(20):  # the warm worker imports it, sees the thread and exits
            if "threadlib" in pool._unsafe_libraries:
                break
            await anyio.sleep(0.3)
        assert "threadlib" in pool._unsafe_libraries
        again = (await pool.run(f"{JOBS}:import_library", {"module": "threadlib"}, timeout_s=60)).result
        assert again["had"] is False
        await anyio.sleep(1.0)
        assert len(os.listdir(f"/proc/{pool.worker_info['pid']}/task")) == 1
