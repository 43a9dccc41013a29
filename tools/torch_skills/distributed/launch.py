"""Fork the ranks and watch them until every one has exited or been stopped.

Use in the job child (the process the warm worker forked for this call):

    exits = launch(plan)        # forks plan.request.world_size ranks running rank.rank_main

Each rank is a fork of the job child, so it starts with torch and the tool modules imported and
lives in the job's session: when the call ends, the pool kills the session and every rank with
it (each rank also dies with the job child, PR_SET_PDEATHSIG). The supervisor never waits on a
rank without a deadline:

- a rank that fails (an exception, a crash, an early exit) gives the others GRACE_S to notice and
  exit, then they are killed (`killed_for="after_failure"`);
- when no rank writes anything (status, collective log) for twice the process group's timeout,
  every rank still running is killed (`killed_for="hang"`). Ranks blocked in a collective time out
  on their own first (the process group's `timeout=` is `hang_timeout_s`);
- a rank that has written its result but has not exited GRACE_S after every other rank is done
  is killed without blame (`killed_for="after_result"`): its work is complete and on disk, so the
  findings count it as ok. Tearing down a process group can stall on a shared store, and that
  stall says nothing about the user's step.

Known limitations: a rank that computes silently for longer than 2 * hang_timeout_s (a very large
model on CPU) is taken for hung; raise hang_timeout_s for such models.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from torch_skills.distributed.rank import DUMP_SIGNAL, Plan, rank_main

GRACE_S = 3.0  # seconds the other ranks get to exit on their own after one fails
POLL_S = 0.01
DUMP_WAIT_S = 0.3  # time a rank gets to write its stack before it is killed


@dataclass
class RankExit:
    rank: int
    pid: int
    exit_code: int | None
    signal: int | None
    killed_for: str | None  # None | "hang" | "after_failure" | "after_result"
    seconds: float


def _activity(plan: Plan, world: int) -> tuple:
    """A signature of every rank file's size and mtime: it changes whenever a rank writes."""
    sig = []
    for rank in range(world):
        for name in ("status", "calls.jsonl"):
            try:
                st = os.stat(plan.path(rank, name))
                sig.append((st.st_size, st.st_mtime_ns))
            except OSError:
                sig.append(None)
    return tuple(sig)


def _failed(plan: Plan, rank: int, status: int) -> bool:
    return not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and _has_result(plan, rank))


def _has_result(plan: Plan, rank: int) -> bool:
    return plan.path(rank, "result.json").exists()


def launch(plan: Plan) -> list[RankExit]:
    """Run every rank to its end (see the module docstring); one RankExit per rank, in rank order."""
    world = plan.request.world_size
    started = time.monotonic()
    pids: dict[int, int] = {}
    try:
        for rank in range(world):
            pid = os.fork()
            if pid == 0:
                rank_main(plan, rank)  # never returns
            pids[pid] = rank
        return _supervise(plan, pids, started, stall_s=2 * plan.request.hang_timeout_s)
    finally:
        for pid in pids:  # whatever happened here, no rank outlives the supervisor
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _supervise(plan: Plan, pids: dict[int, int], started: float, stall_s: float) -> list[RankExit]:
    world = len(pids)
    exits: dict[int, RankExit] = {}
    killed: dict[int, str] = {}
    first_failure: float | None = None
    all_done: float | None = None  # when every rank had exited or written its result
    activity, last_activity = _activity(plan, world), time.monotonic()
    while len(exits) < world:
        for pid, rank in pids.items():
            if rank in exits:
                continue
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if done == 0:
                continue
            exits[rank] = RankExit(
                rank,
                pid,
                os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                killed.get(pid),
                time.monotonic() - started,
            )
            if first_failure is None and pid not in killed and _failed(plan, rank, status):
                first_failure = time.monotonic()
        now = time.monotonic()
        current = _activity(plan, world)
        if current != activity:
            activity, last_activity = current, now
        running = [r for r in pids.values() if r not in exits]
        if all_done is None and running and all(_has_result(plan, r) for r in running):
            all_done = now
        reason = None
        if first_failure is not None and now - first_failure > GRACE_S:
            reason = "after_failure"
        elif all_done is not None and now - all_done > GRACE_S:
            reason = "after_result"
        elif now - last_activity > stall_s:
            reason = "hang"
        if reason is not None:
            doomed = [pid for pid, rank in pids.items() if rank not in exits and pid not in killed]
            for sig in (DUMP_SIGNAL, signal.SIGKILL):  # first the stack dump (faulthandler), then the kill
                for pid in doomed:
                    killed[pid] = reason
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass
                if sig == DUMP_SIGNAL and doomed:
                    time.sleep(DUMP_WAIT_S)
        time.sleep(POLL_S)
    return [exits[r] for r in range(world)]
