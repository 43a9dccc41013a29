"""Decide what bounds a step from measured shares of its time (no torch; plain numbers in, verdict out).

Use:

    verdict = classify(StepEvidence(on_gpu=False, step_time_s=0.010, data_wait_share=None,
                                    work_fraction=0.04, flops_per_step=2e6, ...))
    verdict.bottleneck, verdict.shares, verdict.evidence, verdict.uncertain

How it decides. The step's wall time splits into three measured parts: waiting on the loader
(`data_wait`, timed without the profiler), substantial tensor work (`work`: GPU kernel time on a
GPU; on a CPU, the self time of operator calls longer than the small-op threshold, which is 20
times the calibrated cost of dispatching one tiny op; taken from the profiled steps as a fraction
of their non-data time), and the rest, host overhead (Python, dispatch, launches, syncs, many tiny
ops). The largest part wins. When it is `work`, a roofline estimate
says which limit it is closer to: FLOPs / attainable FLOP/s (compute) against bytes moved /
attainable bytes/s (memory bandwidth), both attainable figures measured on this machine in the
same run as the fastest of a few repetitions, and compared with the fastest timed step (load only
adds time, so best case against best case is the comparison load distorts least).

When the verdict is uncertain. Those shares are ratios of times, and a busy machine does not slow
every op alike (a multi-threaded matmul waits for a descheduled thread, a tiny op does not), so a
close call can flip with load. The verdict is therefore checked against figures load does not
change - the op count, the FLOPs and the bytes moved per step - turned into two estimates of the
step: dispatch overhead = ops x the cost of one tiny op, and work = the larger of FLOPs / attainable
FLOP/s and bytes / attainable bytes/s. `Verdict.uncertain` lists a reason when (1) the two largest
of data wait, work and host overhead are within UNCERTAIN_MARGIN of each other; (2) the estimates
favour the other side by COUNT_FACTOR or more (the timings say overhead and the counts say work,
or the reverse); (3) a roofline verdict whose compute and memory shares are within ROOFLINE_FACTOR
of each other, or whose larger share is within NEAR_THRESHOLD_FACTOR of FAR_FROM_BOTH_LIMITS (the
line between "bound by it" and "unknown", which a rate measured 4x off moves across); (4) a roofline verdict (compute, memory bandwidth, or unknown for being far from
both) while the attainable-rate measurements varied CONTENDED_SPREAD-fold or more between
repetitions, or the timed steps did (slowest / fastest): a contended machine (with several
intra-op threads, one descheduled thread stalls every matmul) measures rates and steps that move
from run to run, and the roofline moves with them; (5) the
same for a step that did its FLOPs (an exact count) COUNT_FACTOR times faster than the attainable
matmul rate allows: the rate was measured while the machine was busier than during the step. The verdict itself is still the timings' call; the reasons say how far to trust it.

Known limitations: bytes moved is an estimate (inputs plus outputs of every op, no cache reuse);
FLOPs count only matmul, convolution, attention, RNN gates and grouped matmuls (flops.py), so a step of elementwise ops
has near-zero compute share by construction; on a CPU host overhead and work are told apart by
op length, so a few long ops that do neither arithmetic nor memory traffic (a sort, a Python-side
loop inside a custom op) end as `unknown`.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_skills.profiling.models import Bottleneck, BottleneckShares, Evidence

SMALL_OP_FACTOR = 20.0  # an op under 20x the cost of dispatching a tiny op is mostly fixed cost
MANY_OPS_PER_STEP = 20  # fewer dispatches than this cannot make a step overhead-bound by themselves
FAR_FROM_BOTH_LIMITS = 0.05  # work that reaches under 5% of both roofline limits is not explained by them
UNCERTAIN_MARGIN = 0.15  # shares closer than 15 points of the step trade places under load
COUNT_FACTOR = 2.0  # the count-based estimates must lean 2x the other way to contradict the timings
ROOFLINE_FACTOR = 1.5  # compute and memory shares within 1.5x: the roofline does not tell them apart
NEAR_THRESHOLD_FACTOR = (
    4.0  # roofline shares within 4x of FAR_FROM_BOTH_LIMITS: unknown vs bound is a close call
)
CONTENDED_SPREAD = 2.0  # repetitions of one matmul or copy 2x apart: the attainable rates are not steady


@dataclass(frozen=True)
class StepEvidence:
    """The measured facts the verdict rests on (per step, seconds, FLOPs, bytes)."""

    on_gpu: bool
    step_time_s: float  # median, without the profiler
    data_wait_share: float | None  # next(loader) time / step time over the timed steps; None: no loader
    work_fraction: (
        float  # of the non-data step time: GPU kernels, or CPU op calls above the small-op threshold
    )
    flops_per_step: float
    attainable_flops_per_s: float
    bytes_per_step: float
    attainable_bytes_per_s: float
    ops_per_step: float
    median_op_time_s: float
    per_op_overhead_s: float
    host_syncs_per_step: int
    fastest_step_s: float | None = None  # the least loaded timed step; None: use step_time_s
    calibration_spread: float = 1.0  # slowest / fastest repetition of the attainable-rate measurements
    step_spread: float = 1.0  # slowest / fastest timed step


@dataclass(frozen=True)
class Verdict:
    bottleneck: Bottleneck
    shares: BottleneckShares
    evidence: list[Evidence]
    uncertain: list[str]  # why the verdict may differ on a quieter or busier machine; empty: it holds


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else 0.0


def _clip(x: float) -> float:
    return min(1.0, max(0.0, x))


def classify(e: StepEvidence) -> Verdict:
    """The bottleneck, the shares of step time behind it, and the evidence in words."""
    data = _clip(e.data_wait_share) if e.data_wait_share is not None else None
    work = (1.0 - (data or 0.0)) * _clip(e.work_fraction)
    host = _clip(1.0 - work - (data or 0.0))
    fastest = e.fastest_step_s or e.step_time_s  # best case against the calibration's best case
    compute = _clip(_ratio(_ratio(e.flops_per_step, e.attainable_flops_per_s), fastest))
    memory = _clip(_ratio(_ratio(e.bytes_per_step, e.attainable_bytes_per_s), fastest))
    shares = BottleneckShares(
        data_wait=data, host_overhead=host, work=work, compute=compute, memory_bandwidth=memory
    )
    evidence = _evidence(e, shares)

    bottleneck: Bottleneck
    if data is not None and data >= max(host, work):
        bottleneck = "data_loading"
    elif host >= work:
        many_small = e.ops_per_step >= MANY_OPS_PER_STEP or e.host_syncs_per_step > 0
        bottleneck = "cpu_overhead" if many_small else "unknown"
    elif max(compute, memory) < FAR_FROM_BOTH_LIMITS:
        bottleneck = "unknown"
    else:
        bottleneck = "compute" if compute >= memory else "memory_bandwidth"
    return Verdict(bottleneck, shares, evidence, _uncertainty(e, shares, bottleneck))


def count_estimates(e: StepEvidence) -> tuple[float, float]:
    """(dispatch overhead, work) in seconds per step from counts that load does not change."""
    overhead = e.ops_per_step * e.per_op_overhead_s
    work = max(
        _ratio(e.flops_per_step, e.attainable_flops_per_s), _ratio(e.bytes_per_step, e.attainable_bytes_per_s)
    )
    return overhead, work


def _uncertainty(e: StepEvidence, s: BottleneckShares, bottleneck: Bottleneck) -> list[str]:
    reasons = []
    parts = sorted(
        [("waiting on the loader", s.data_wait or 0.0), ("work", s.work), ("host overhead", s.host_overhead)],
        key=lambda part: -part[1],
    )
    (first, a), (second, b) = parts[0], parts[1]
    if bottleneck != "unknown" and a - b < UNCERTAIN_MARGIN:
        reasons.append(
            f"{first} ({a:.0%}) and {second} ({b:.0%}) are within {UNCERTAIN_MARGIN:.0%} of the step "
            "of each other; machine load shifts them this much"
        )
    overhead, work = count_estimates(e)
    host_side = bottleneck == "cpu_overhead" or (bottleneck == "unknown" and s.host_overhead >= s.work)
    work_side = bottleneck in ("compute", "memory_bandwidth") or (
        bottleneck == "unknown" and s.work > s.host_overhead
    )
    if host_side and work >= COUNT_FACTOR * overhead and work > 0:
        reasons.append(
            f"the timings say host overhead, but the counts say work: the FLOPs and bytes need "
            f"{work * 1e3:.3g} ms at the attainable rates against {overhead * 1e3:.3g} ms to dispatch "
            f"{e.ops_per_step:.0f} ops"
        )
    if work_side and overhead >= COUNT_FACTOR * work and overhead > 0:
        reasons.append(
            f"the timings say work, but the counts say host overhead: dispatching {e.ops_per_step:.0f} "
            f"ops costs about {overhead * 1e3:.3g} ms against {work * 1e3:.3g} ms for the FLOPs and bytes "
            "at the attainable rates"
        )
    if work_side and e.calibration_spread >= CONTENDED_SPREAD:
        reasons.append(
            f"the attainable matmul or copy rate varied {e.calibration_spread:.1f}x between repetitions: "
            "the machine is contended, so the compute and memory shares rest on unsteady rates"
        )
    if work_side and e.step_spread >= CONTENDED_SPREAD:
        reasons.append(
            f"the slowest timed step took {e.step_spread:.1f}x the fastest: the machine is contended or "
            "the step varies, so its share of either limit moves between runs"
        )
    fastest = e.fastest_step_s or e.step_time_s
    flops_time = _ratio(e.flops_per_step, e.attainable_flops_per_s)
    if work_side and fastest > 0 and flops_time >= COUNT_FACTOR * fastest:
        reasons.append(
            f"the step did its FLOPs {flops_time / fastest:.1f}x faster than the attainable matmul rate "
            "measured in this run allows: that rate was measured under heavier load than the step"
        )
    nearest = max(s.compute, s.memory_bandwidth)
    if (
        work_side
        and FAR_FROM_BOTH_LIMITS / NEAR_THRESHOLD_FACTOR
        <= nearest
        < FAR_FROM_BOTH_LIMITS * NEAR_THRESHOLD_FACTOR
    ):
        reasons.append(
            f"the step reaches {nearest:.1%} of the nearer roofline limit, close to the "
            f"{FAR_FROM_BOTH_LIMITS:.0%} below which no limit explains it: a busier or quieter machine moves "
            "it across that line"
        )
    if bottleneck in ("compute", "memory_bandwidth"):
        low, high = sorted((s.compute, s.memory_bandwidth))
        if high < ROOFLINE_FACTOR * low:
            reasons.append(
                f"compute ({s.compute:.0%}) and memory traffic ({s.memory_bandwidth:.0%}) are within "
                f"{ROOFLINE_FACTOR:g}x of each other; the roofline does not tell them apart"
            )
    return reasons


def _evidence(e: StepEvidence, s: BottleneckShares) -> list[Evidence]:
    where = "GPU kernels" if e.on_gpu else f"ops longer than {SMALL_OP_FACTOR:g}x the tiny-op cost"
    items = []
    if s.data_wait is not None:
        items.append(
            Evidence(
                metric="data_wait_share",
                value=s.data_wait,
                meaning=f"{s.data_wait:.0%} of the step waits on next(loader)",
            )
        )
    items += [
        Evidence(metric="work_share", value=s.work, meaning=f"{s.work:.0%} of the step is in {where}"),
        Evidence(metric="host_overhead_share", value=s.host_overhead,
                 meaning=f"{s.host_overhead:.0%} of the step is host-side overhead: Python, dispatch, "
                 "kernel launches, syncs, tiny ops"),
        Evidence(metric="compute_share", value=s.compute,
                 meaning=f"the step's FLOPs would take {s.compute:.1%} of it at the attainable matmul rate"),
        Evidence(metric="memory_share", value=s.memory_bandwidth,
                 meaning=f"its bytes moved would take {s.memory_bandwidth:.1%} of it at the attainable copy rate"),
        Evidence(metric="ops_per_step", value=e.ops_per_step,
                 meaning=f"{e.ops_per_step:.0f} operator dispatches per step"),
        Evidence(metric="count_overhead_estimate_s", value=count_estimates(e)[0],
                 meaning=f"{e.ops_per_step:.0f} ops x the cost of one tiny op: "
                 f"{count_estimates(e)[0] * 1e3:.3g} ms of dispatch per step (load does not change the count)"),
        Evidence(metric="count_work_estimate_s", value=count_estimates(e)[1],
                 meaning=f"the FLOPs and bytes at the attainable rates: {count_estimates(e)[1] * 1e3:.3g} ms "
                 "per step (load does not change the counts)"),
        Evidence(metric="median_op_time_over_dispatch_cost", value=_ratio(e.median_op_time_s, e.per_op_overhead_s),
                 meaning=f"the median op takes {_ratio(e.median_op_time_s, e.per_op_overhead_s):.1f}x the "
                 "cost of dispatching a tiny op"),
    ]  # fmt: skip
    if e.host_syncs_per_step:
        items.append(
            Evidence(
                metric="host_syncs_per_step",
                value=float(e.host_syncs_per_step),
                meaning=f"{e.host_syncs_per_step} host reads of tensor values per step",
            )
        )
    return items
