"""The rank supervisor on stand-in ranks: forked processes that write rank files, no process group."""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

from torch_skills.distributed import launch as launch_module
from torch_skills.distributed.findings import RankFiles
from torch_skills.distributed.rank import Plan


def _plan(tmp_path, world=2, hang_timeout_s=30):
    request = SimpleNamespace(world_size=world, hang_timeout_s=hang_timeout_s)
    return Plan(request=request, dir=tmp_path, cwd=tmp_path, roots=[tmp_path], device="cpu")  # type: ignore[arg-type]


def _run(plan, behaviours):
    """Fork one stand-in rank per behaviour and supervise them as launch() does."""
    pids = {}
    for rank, behaviour in enumerate(behaviours):
        pid = os.fork()
        if pid == 0:
            try:
                plan.path(rank, "status").write_text("finished")
                plan.path(rank, "result.json").write_text(
                    json.dumps({"rank": rank, "steps": [], "usage": []})
                )
                if behaviour == "stuck after its result":
                    time.sleep(600)
            finally:
                os._exit(0)
        pids[pid] = rank
    try:
        return launch_module._supervise(plan, pids, time.monotonic(), stall_s=60)
    finally:
        for pid in pids:
            try:
                os.kill(pid, 9)
            except OSError:
                pass


def test_a_rank_stuck_after_writing_its_result_is_stopped_quickly_and_counted_ok(tmp_path, monkeypatch):
    """Teardown stalls (a process group's shared store) must not turn a finished step into a hang."""
    monkeypatch.setattr(launch_module, "GRACE_S", 0.5)
    plan = _plan(tmp_path)
    started = time.monotonic()
    exits = _run(plan, ["exits", "stuck after its result"])
    assert time.monotonic() - started < 30  # the stall timeout is 60 s: it was not waited for
    assert exits[0].exit_code == 0 and exits[0].killed_for is None
    assert exits[1].killed_for == "after_result"
    ranks = RankFiles.read(plan, exits)
    assert [r.outcome() for r in ranks] == ["ok", "ok"]


def test_ranks_that_all_exit_after_their_results_are_not_killed(tmp_path):
    plan = _plan(tmp_path)
    exits = _run(plan, ["exits", "exits"])
    assert [(e.exit_code, e.killed_for) for e in exits] == [(0, None), (0, None)]
