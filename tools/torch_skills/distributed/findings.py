"""Cross-rank analysis: from the rank files to findings, each with what it concerns and the fix.

Use in the job child after `launch`: `RankFiles.read(plan, exits)` loads what every rank left,
then each `*_findings` function returns a list of DistributedFinding (empty when all is well).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from torch_skills.distributed.launch import RankExit
from torch_skills.distributed.models import DistributedFinding, RankCall, RankReport, StepStats
from torch_skills.distributed.rank import Plan
from torch_skills.results import format_bytes

SKILL = "distributed-training-strategies"
# An exception that only says a peer went away or a collective timed out: a consequence, not a cause.
_WAITED = ("timed out", "timeout", "connection closed", "connection reset", "broken pipe", "peer")
OVERLAP_FLAG = 0.05  # ranks sharing more than this share of their samples: not sharded


def _read_json(path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _read_text(path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _written_at(path) -> float | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime if st.st_size else None


def _fault_where(dump: str) -> str | None:
    """The innermost user frame of a faulthandler dump ('File "x.py", line 12 in forward', innermost first)."""
    import sysconfig

    from torch_skills import OWN_DIRS

    library = tuple(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib"))
    for line in dump.splitlines():
        line = line.strip()
        if not line.startswith('File "'):
            continue
        path = line.split('"')[1]
        if path.startswith(OWN_DIRS) or path.startswith(library) or path.startswith("<"):
            continue
        return f"{path}:{line.split('line ')[1].split()[0]}" if "line " in line else path
    return None


@dataclass
class RankFiles:
    """Everything one rank left behind."""

    exit: RankExit
    status: str
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    calls: list[dict[str, Any]] = field(default_factory=list)
    fault_where: str | None = None  # from faulthandler's dump of a crashed rank
    crashed_at: float | None = None  # when faulthandler wrote that dump (the file's mtime), else None

    @classmethod
    def read(cls, plan: Plan, exits: list[RankExit]) -> list[RankFiles]:
        ranks = []
        for e in exits:
            fault = plan.path(e.rank, "fault.txt")
            calls = []
            text = _read_text(plan.path(e.rank, "calls.jsonl")) or ""
            for line in text.splitlines():
                try:
                    calls.append(json.loads(line))
                except ValueError:
                    break  # a line cut by a kill
            ranks.append(
                cls(
                    e,
                    _read_text(plan.path(e.rank, "status")) or "starting",
                    _read_json(plan.path(e.rank, "result.json")),
                    _read_json(plan.path(e.rank, "error.json")),
                    calls,
                    _fault_where(_read_text(fault) or ""),
                    _written_at(fault),
                )
            )
        return ranks

    @property
    def ok(self) -> bool:
        """The rank wrote its result and exited cleanly, or was stopped only after writing it."""
        return self.result is not None and (
            self.exit.exit_code == 0 or self.exit.killed_for == "after_result"
        )

    @property
    def waited(self) -> bool:
        """Failed only because a peer did not answer (timeout, connection closed)."""
        if self.error is None or self.error.get("type") == "SystemExit":
            return self.exit.killed_for == "after_failure"
        text = (self.error.get("message") or "").lower()
        return any(w in text for w in _WAITED)

    def outcome(self) -> str:
        if self.ok:
            return "ok"
        if self.exit.killed_for is not None:
            return "hung"
        if self.error is not None:
            return "exited_early" if self.error.get("type") == "SystemExit" else "error"
        if self.exit.signal is not None:
            return "crashed"
        return "exited_early"

    def report(self) -> RankReport:
        steps = [StepStats.model_validate(s) for s in (self.result or {}).get("steps", [])]
        error = None
        if self.error is not None:
            error = f"{self.error.get('type')}: {self.error.get('message', '')}"[:1500]
        return RankReport(
            rank=self.exit.rank,
            outcome=self.outcome(),  # type: ignore[arg-type]
            phase=self.status,
            exit_code=self.exit.exit_code,
            signal=self.exit.signal,
            error=error,
            steps=steps,
            peak_memory_bytes=(self.result or {}).get("peak_memory_bytes"),
        )


# ------------------------------------------------------------------------------------------------
def failure_findings(ranks: list[RankFiles]) -> list[DistributedFinding]:
    """A rank that crashed, raised, exited early or hung: named, with where it was and what it said."""
    failed = [r for r in ranks if not r.ok]
    if not failed:
        return []
    culprits = [r for r in failed if not r.waited]
    # A rank that died of a signal while another rank raised or exited by itself is counted as stopped
    # with it: the peer going away is the likeliest cause (a collective library's C++ thread aborts on
    # a closed connection, outside Python, so the rank leaves no error of its own). Were the crash its
    # own, it shows again once the first failure is fixed.
    if any(r.outcome() in ("error", "exited_early") for r in culprits):
        culprits = [r for r in culprits if r.outcome() != "crashed"]
    culprits = _first_crash_and_its_kind(culprits)
    if not culprits:  # every failed rank only waited on a peer: the one killed outside a collective hung
        culprits = [r for r in failed if r.error is None and r.exit.killed_for is not None] or failed
    findings = []
    groups: dict[tuple, list[RankFiles]] = {}  # ranks that failed the same way are one finding
    for r in culprits:
        key = (r.outcome(), r.status, (r.error or {}).get("type"), (r.error or {}).get("message"))
        groups.setdefault(key, []).append(r)
    victims = [x.exit.rank for x in failed if x not in culprits]
    for (outcome, status, _, _), group in groups.items():
        r = group[0]
        what = {
            "error": f"raised {r.error.get('type') if r.error else 'an exception'}",
            "crashed": f"was killed by signal {r.exit.signal}",
            "exited_early": f"exited early (exit code {r.exit.exit_code}) without finishing its steps",
            "hung": "stopped making progress and was killed",
        }.get(outcome, outcome)
        if r.waited and outcome == "error":
            what = "timed out waiting for its peers in a collective"
        detail = f": {r.error.get('message', '').splitlines()[0][:300]}" if r.error else ""
        if outcome == "hung":
            waiting = [x.exit.rank for x in failed if x.waited and x.error is not None]
            detail = (
                f" (its peers {waiting} timed out in a collective it never reached)" if waiting else ""
            ) + f"; killed after {r.exit.seconds:.0f} s"
        names = [x.exit.rank for x in group]
        who = f"rank {names[0]}" if len(names) == 1 else f"ranks {names}"
        tail = f" Ranks {victims} were stopped with it (they waited on it)." if victims else ""
        where = sorted({w for x in group if (w := (x.error or {}).get("where") or x.fault_where)})
        findings.append(
            DistributedFinding(
                severity="error",
                kind="rank_failure",
                code=f"rank_{outcome}",
                ranks=names,
                where=where,
                message=f"{who} {what} during '{status}'{detail}.{tail}",
                fix="Fix the failure on that rank first (the traceback is in ranks[].error); a rank that "
                "exits or raises mid-step leaves every other rank blocked in its next collective "
                "until the process group's timeout.",
                skill=SKILL,
            )
        )
    return findings


def _first_crash_and_its_kind(culprits: list[RankFiles]) -> list[RankFiles]:
    """Of several ranks killed by signals, the first to die and those that died the same way.

    A rank whose peer segfaulted often aborts a moment later (SIGABRT from the collective library's
    thread on the closed connection, in whatever phase it had reached): it is a victim. Ranks that
    crashed with the same signal in the same phase are one bug on every rank and stay together.
    The order comes from the time faulthandler wrote each dump when every crashed rank left one;
    otherwise (a SIGKILL, from the OOM killer say, leaves none) from the exits the supervisor saw.
    """
    crashed = [r for r in culprits if r.outcome() == "crashed"]
    if len(crashed) < 2:
        return culprits
    if all(r.crashed_at is not None for r in crashed):
        first = min(crashed, key=lambda r: (r.crashed_at, r.exit.seconds))
    else:
        first = min(crashed, key=lambda r: r.exit.seconds)
    later = [r for r in crashed if (r.exit.signal, r.status) != (first.exit.signal, first.status)]
    return [r for r in culprits if r not in later]


def _key(call: dict[str, Any] | None) -> tuple | None:
    if call is None:
        return None
    return (call["op"], json.dumps(call["shapes"]), call["dtype"])


def mismatch_findings(ranks: list[RankFiles], culprit_ranks: set[int]) -> list[DistributedFinding]:
    """The first collective where the ranks' sequences differ (op, shapes, dtype, or a missing call)."""
    logs = [r.calls for r in ranks]
    longest = max((len(c) for c in logs), default=0)
    for i in range(longest):
        at = [c[i] if i < len(c) else None for c in logs]
        keys = [_key(a) for a in at]
        if len(set(keys)) == 1:
            continue
        missing = [r.exit.rank for r, a in zip(ranks, at, strict=True) if a is None]
        present = {k for k in keys if k is not None}
        if missing and set(missing) <= culprit_ranks and len(present) <= 1:
            return []  # the only difference: a rank that failed made no more calls (rank_failure says so)
        calls = [
            RankCall(
                rank=r.exit.rank,
                seq=i if a else None,
                op=a["op"] if a else None,
                shapes=a["shapes"] if a else [],
                dtype=a["dtype"] if a else None,
                where=a["where"] if a else None,
            )
            for r, a in zip(ranks, at, strict=True)
        ]
        described = "; ".join(
            f"rank {c.rank}: {c.op} {c.shapes} {c.dtype} at {c.where}" if c.op else f"rank {c.rank}: no call"
            for c in calls
        )
        step = next((a["step"] for a in at if a), None)
        lone = [c.rank for c in calls if c.op] if missing else []
        return [
            DistributedFinding(
                severity="error",
                kind="collective_mismatch",
                code="collective_alone" if missing else "collective_differs",
                ranks=[c.rank for c in calls],
                where=sorted({c.where for c in calls if c.where and not c.where.startswith("DDP")}),
                calls=calls,
                message=f"collective #{i} (step {step}) differs across ranks: {described}."
                + (f" Only ranks {lone} called it: they wait for the rest forever." if lone else ""),
                fix="Every rank must call the same collectives in the same order with the same shapes and "
                "dtypes: move the call out of rank-dependent branches (if rank == 0 / data-dependent "
                "ifs), or make every rank call it (a metric reduced by all ranks, logged by rank 0).",
                skill=SKILL,
            )
        ]
    return []


def unused_findings(ranks: list[RankFiles], strategy: str) -> list[DistributedFinding]:
    """Parameters some step did not reach: always (every rank, every step) or data-dependent."""
    results = [r.result for r in ranks if r.result is not None]
    if not results:
        return []
    per: dict[str, list[tuple[int, int]]] = {}  # name -> [(rank, step)] where unused
    total = 0
    for res in results:
        for u in res["usage"]:
            total += 1
            for n in u["unused"]:
                per.setdefault(n, []).append((res["rank"], u["step"]))
    if not per:
        return []
    sites: dict[str, Any] = {}
    for res in results:
        sites.update(res.get("sites", {}))
    always = sorted(n for n, where in per.items() if len(where) == total)
    sometimes = sorted(n for n in per if n not in always)
    findings = []
    if always:
        modules = sorted({sites.get(n, {}).get("module", n) for n in always})
        nbytes = sum(sites.get(n, {}).get("bytes", 0) for n in always)
        where = sorted({s["where"] for n in always if (s := sites.get(n)) and s.get("where")})
        findings.append(
            DistributedFinding(
                severity="error" if strategy == "ddp" else "warning",
                kind="unused_parameters",
                code="always_unused",
                names=always,
                where=where,
                measured={"bytes": float(nbytes), "steps_checked": float(total)},
                message=f"{len(always)} parameter(s) are not reached from the loss on any rank in any step "
                f"({', '.join(always[:6])}{'...' if len(always) > 6 else ''}; modules {modules[:4]}). "
                "Plain DDP fails at the next step with 'Expected to have finished reduction in the "
                "prior iteration'.",
                fix=f"Remove the module(s) {modules[:4]} if they are dead code, or freeze them "
                "(requires_grad_(False)) before wrapping. find_unused_parameters=True also works but "
                f"walks the autograd graph every step and still all-reduces these {format_bytes(nbytes)} "
                "of zeros.",
                skill=SKILL,
            )
        )
    if sometimes:
        where_seen = {n: sorted({f"rank {r} step {s}" for r, s in per[n]}) for n in sometimes}
        nbytes = sum(sites.get(n, {}).get("bytes", 0) for n in sometimes)
        where = sorted({s["where"] for n in sometimes if (s := sites.get(n)) and s.get("where")})
        example = sometimes[0]
        findings.append(
            DistributedFinding(
                severity="error" if strategy == "ddp" else "warning",
                kind="unused_parameters",
                code="data_dependent_unused",
                names=sometimes,
                where=where,
                ranks=sorted({r for n in sometimes for r, _ in per[n]}),
                measured={"bytes": float(nbytes), "steps_checked": float(total)},
                message=f"{len(sometimes)} parameter(s) are used on some ranks/steps but not others (the branch "
                f"taken depends on the batch): {example} unused at {', '.join(where_seen[example][:4])}. "
                "Plain DDP then hangs or fails with 'Expected to have finished reduction'.",
                fix="Pass find_unused_parameters=True to DDP (cost: a walk of the autograd graph every "
                "step plus an all-reduce of the used-parameter map), or make every branch touch every "
                "parameter (add 0 * the skipped branch's output) so the graph is the same on all ranks.",
                skill=SKILL,
            )
        )
    return findings


def divergence_findings(plan: Plan, ranks: list[RankFiles], strategy: str) -> list[DistributedFinding]:
    """Parameters/buffers whose values differ across ranks after a step (first such step)."""
    import torch

    ok = [r for r in ranks if r.result is not None]
    if len(ok) < 2:
        return []
    steps = min(len(r.result["steps"]) for r in ok)  # type: ignore[index]
    changed = {n for r in ok for u in r.result["usage"] for n in u["changed_outside_autograd"]}  # type: ignore[index]
    frozen = set(ok[0].result.get("frozen", []))  # type: ignore[union-attr]
    for step in range(1, steps + 1):
        states = []
        for r in ok:
            try:
                states.append(torch.load(plan.path(r.exit.rank, f"state{step}.pt"), weights_only=True))
            except (OSError, RuntimeError):
                return []
        differing: dict[str, float] = {}
        for name, (digest, sample) in states[0].items():
            if strategy == "ddp" and name.startswith("buffer:"):
                continue  # DDP broadcasts rank 0's buffers at the start of every forward
            worst = 0.0
            same = True
            for other in states[1:]:
                od, osample = other.get(name, (None, None))
                if od != digest:
                    same = False
                    if osample is not None and osample.shape == sample.shape:
                        worst = max(worst, float((osample - sample).abs().max()))
            if not same:
                differing[name] = worst
        if not differing:
            continue
        names = sorted(differing, key=lambda n: -differing[n])
        plain = [n.split(":", 1)[1] for n in names]
        causes = []
        if any(n in changed for n in plain):
            causes.append(
                f"{[n for n in plain if n in changed][:4]} changed during forward/backward, outside "
                "autograd (in-place on .data or under no_grad, from each rank's own batch)"
            )
        if any(n.startswith("buffer:") for n in names):
            causes.append(
                "buffers are updated from each rank's local batch and never synchronized (FSDP does "
                "not broadcast buffers)"
            )
        if any(n in frozen for n in plain):
            causes.append(
                "frozen parameters changed by rank-dependent code (DDP syncs them only at wrap time)"
            )
        if not causes:
            causes.append(
                "their gradients were not averaged across ranks (parameters added after wrapping, or "
                "excluded from DDP), so each rank stepped with its own gradient"
            )
        largest = differing[names[0]]
        sites = {k: v for r in ok for k, v in r.result.get("forward_sites", {}).items()}  # type: ignore[union-attr]
        where = sorted({sites[n] for n in plain if n in sites})
        return [
            DistributedFinding(
                severity="error",
                kind="replica_divergence",
                code="replicas_differ",
                names=plain,
                where=where,
                measured={"step": float(step), "largest_difference": largest},
                message=f"after step {step}, {len(plain)} tensor(s) differ across ranks ({', '.join(plain[:5])}); "
                f"largest difference {largest:.3g} (over up to 4096 sampled elements). Likely cause: "
                + "; ".join(causes)
                + ".",
                fix="Keep replicas identical: change values only through the optimizer on all-reduced "
                "gradients; state updated in forward should be a buffer computed the same way on every "
                "rank or all-reduced (dist.all_reduce(buf, op=AVG)); BatchNorm under FSDP: "
                "nn.SyncBatchNorm.convert_sync_batchnorm(model).",
                skill=SKILL,
            )
        ]
    return []


def data_findings(
    ranks: list[RankFiles], world: int
) -> tuple[list[DistributedFinding], dict | None, list[str]]:
    """(findings, DataReport fields, notes) from the ranks' loader observations."""
    obs = [(r.exit.rank, r.result["data"]) for r in ranks if r.result and r.result.get("data")]
    if not obs:
        return [], None, []
    first = obs[0][1]
    findings: list[DistributedFinding] = []
    notes: list[str] = []
    # Overlap of the samples themselves (a hash per row): sampler indices would compare positions in
    # datasets that may differ per rank (a Subset or a file per rank).
    sets = [set(o["fingerprints"]) for _, o in obs]
    overlap = 0.0
    for i, a in enumerate(sets):
        for j, b in enumerate(sets):
            if i != j and a:
                overlap = max(overlap, len(a & b) / len(a))
    if overlap > OVERLAP_FLAG:
        findings.append(
            DistributedFinding(
                severity="error" if overlap >= 0.5 else "warning",
                kind="data_sharding",
                code="no_distributed_sampler",
                ranks=[r for r, _ in obs],
                measured={"overlap": overlap},
                message=f"the ranks' loaders overlap: up to {overlap:.0%} of one rank's samples are also another "
                f"rank's (sampler: {first['sampler']}). {world} ranks then train on the same data "
                f"{world} times per step.",
                fix="Give the DataLoader sampler=DistributedSampler(dataset, num_replicas=world_size, rank=rank, "
                "shuffle=True) (and no shuffle= of its own), and call sampler.set_epoch(epoch) each epoch.",
                skill=SKILL,
            )
        )
    counts = [o["batches"] for _, o in obs]
    known = [c for c in counts if c is not None]
    if len(set(known)) > 1:
        findings.append(
            DistributedFinding(
                severity="error",
                kind="data_sharding",
                code="unequal_batches",
                ranks=[r for r, _ in obs],
                measured={
                    f"rank{r}_batches": float(o["batches"]) for r, o in obs if o["batches"] is not None
                },
                message=f"ranks get different numbers of batches per epoch ({counts}): the ranks with more "
                "batches block in their last step's all-reduce waiting for ranks that have finished.",
                fix="Use DistributedSampler(..., drop_last=True) or DataLoader(drop_last=True) so every rank "
                "gets the same count, or run the loop under torch.distributed.algorithms.Join([model]).",
                skill=SKILL,
            )
        )
    repeats = [
        r
        for r, o in obs
        if o["shuffled"] and o["repeat_without_set_epoch"] and o["set_epoch_changes_order"] is not True
    ]
    if repeats:
        findings.append(
            DistributedFinding(
                severity="warning",
                kind="data_sharding",
                code="order_repeats",
                ranks=repeats,
                message=f"the shuffled order is the same in every epoch (sampler {first['sampler']}"
                + (
                    ", whose set_epoch does not change it"
                    if first["set_epoch_changes_order"] is False
                    else ", which has no set_epoch"
                )
                + "): each epoch revisits the samples in the same order.",
                fix="Use DistributedSampler(shuffle=True) and call sampler.set_epoch(epoch) at the start of "
                "every epoch (it seeds the shuffle with seed + epoch).",
                skill=SKILL,
            )
        )
    elif any(o["set_epoch_changes_order"] for _, o in obs):
        notes.append(
            "the sampler's order repeats across epochs until set_epoch(epoch) is called (measured: "
            "identical order twice without it, a new order after set_epoch(1)); call it at each epoch start"
        )
    report = {
        "loader": first["loader"],
        "sampler": first["sampler"],
        "batches_per_rank": counts,
        "overlap": overlap,
        "order_repeats_across_epochs": first["repeat_without_set_epoch"],
        "measured_on": f"the samples of the {sum(len(o['fingerprints']) for _, o in obs)} rows the ranks "
        "trained on (a hash per row)",
    }
    return findings, report, notes
