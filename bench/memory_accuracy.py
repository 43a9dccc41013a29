"""How close estimate_memory comes to measured peak memory, against today's rules of thumb.

Run:
    python bench/memory_accuracy.py                # every zoo case, on CUDA when present, else CPU
    python bench/memory_accuracy.py --device cpu   # force the CPU ground truth
    python bench/memory_accuracy.py --skip-7b      # leave out the 7B timing

For each model of tests/fixtures/memory_models.py (ZOO), in train (Adam) and inference, in fp32
and bf16 autocast, it prints the measured peak, the estimate and the relative error of:

- estimate: estimate_memory's fake-tensor trace (`torch_skills.memory.trace` + `torch_skills.memory.estimate`);
- weights x4 (train) / x1 (inference): the "4 bytes of state per weight byte for Adam" rule;
- summary: parameters + 2 x the sum of every leaf module's output + the input, the
  torchsummary-style "forward/backward pass size" figure.

Ground truth (`torch_skills.memory.groundtruth`, which shares no counting code with the estimate):
on CUDA, `torch.cuda.max_memory_allocated()` after `reset_peak_memory_stats()` in a fresh
process per case (the allocator starts empty); on CPU, the peak of live bytes in the CPU
allocator, from the profiler's allocation events, over three real steps.

Then it times the 7B (Llama-2-7B shapes) estimate in a child process and reports its wall time
and peak RSS (`getrusage(RUSAGE_CHILDREN)`), against the goal of <= 60 s and <= 2 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import torch  # noqa: E402

import server  # noqa: E402,F401  (registers torch_skills from this clone)
from tests.fixtures import memory_models as zoo  # noqa: E402
from torch_skills.memory.estimate import Target, estimate_trace  # noqa: E402
from torch_skills.memory.groundtruth import measure_real_step  # noqa: E402
from torch_skills.memory.overheads import local_gpu_is_hopper  # noqa: E402
from torch_skills.memory.trace import StepSpec, fake_mode, trace_step  # noqa: E402
from torch_skills.runner.usercode import default_loss  # noqa: E402

MiB = 2**20


def mean_loss(output, batch):
    return default_loss(output)


def precisions(device: str) -> list[str]:
    if device == "cuda" and not torch.cuda.is_bf16_supported():
        return ["fp32"]
    return ["fp32", "bf16_autocast"]


def run_case(name: str, mode: str, precision: str, device: str) -> dict:
    """Estimate and measure one case on `device`; return the figures as a dict."""
    build, inputs, loss, batch = zoo.ZOO[name]
    loss = loss or mean_loss
    cuda = device == "cuda"
    spec = StepSpec(mode=mode, optimizer="adam", precision=precision, foreach=True if cuda else None)
    started = time.perf_counter()
    trace = trace_step(build, inputs, loss, spec, device=device, batch_size=batch)
    est = estimate_trace(
        trace, Target(cuda=cuda, training=mode == "train", hopper=bool(local_gpu_is_hopper()))
    )
    estimate_s = time.perf_counter() - started
    started = time.perf_counter()
    truth = measure_real_step(build, inputs, loss, spec, batch_size=batch, device=device)
    truth_s = time.perf_counter() - started
    weights = trace.param_bytes * (4 if mode == "train" else 1)
    summary = trace.param_bytes + 2 * leaf_output_bytes(build, inputs, batch, precision) + trace.input_bytes
    return {
        "model": name,
        "mode": mode,
        "precision": precision,
        "batch": batch,
        "truth": truth.peak_allocated_bytes,
        "truth_reserved": truth.peak_reserved_bytes,
        "estimate": est.peak_allocated,
        "estimate_reserved": est.peak_reserved if cuda else None,
        "weights_rule": weights,
        "summary_rule": summary,
        "phase": est.phase,
        "estimate_s": estimate_s,
        "truth_s": truth_s,
    }


def leaf_output_bytes(build, inputs, batch: int, precision: str) -> int:
    """Sum of the output bytes of every leaf module in one forward (on fake tensors: nothing is allocated)."""
    total = 0

    def hook(module, args, output):
        nonlocal total
        for t in torch.utils._pytree.tree_leaves(output):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()

    with fake_mode():
        model = build()
        x = inputs(batch)
        handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
        dtype = torch.bfloat16 if precision == "bf16_autocast" else None
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            model(*x) if isinstance(x, tuple) else model(x)
        for h in handles:
            h.remove()
    return total


def rel(value: int, truth: int) -> float:
    return (value - truth) / truth if truth else 0.0


def cases(device: str) -> list[tuple[str, str, str]]:
    return [(n, m, p) for n in zoo.ZOO for m in ("train", "inference") for p in precisions(device)]


def run_in_fresh_process(case: tuple[str, str, str], device: str) -> dict:
    """One CUDA case per process, so every measurement starts from an empty caching allocator."""
    out = subprocess.run(
        [sys.executable, __file__, "--one", ":".join(case), "--device", device],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def print_table(rows: list[dict], device: str) -> None:
    cuda = device == "cuda"
    head = (
        f"{'model':17s} {'mode':9s} {'precision':13s} {'truth MiB':>10s} {'estimate':>10s} {'error':>7s} "
        f"{'weights-rule':>12s} {'summary-rule':>12s} {'peak phase':>14s}"
    )
    if cuda:
        head += f" {'reserved truth':>14s} {'est':>8s} {'err':>7s}"
    print(head)
    print("-" * len(head))
    for r in rows:
        line = (
            f"{r['model']:17s} {r['mode']:9s} {r['precision']:13s} {r['truth'] / MiB:10.2f} {r['estimate'] / MiB:10.2f} "
            f"{rel(r['estimate'], r['truth']):+7.1%} {rel(r['weights_rule'], r['truth']):+12.1%} "
            f"{rel(r['summary_rule'], r['truth']):+12.1%} {r['phase']:>14s}"
        )
        if cuda and r["truth_reserved"]:
            line += (
                f" {r['truth_reserved'] / MiB:14.2f} {r['estimate_reserved'] / MiB:8.2f} "
                f"{rel(r['estimate_reserved'], r['truth_reserved']):+7.1%}"
            )
        print(line)
    print()
    for label, key in (
        ("estimate_memory", "estimate"),
        ("weights x4/x1", "weights_rule"),
        ("params + 2 x outputs", "summary_rule"),
    ):
        errors = [abs(rel(r[key], r["truth"])) for r in rows]
        print(f"{label:22s} median |error| {statistics.median(errors):7.2%}   worst {max(errors):8.2%}")
    ours = [abs(rel(r["estimate"], r["truth"])) for r in rows]
    floor = 0.001  # errors below 0.1% count as 0.1%, so the ratio stays finite and conservative
    for label, key in (("weights x4/x1", "weights_rule"), ("params + 2 x outputs", "summary_rule")):
        theirs = [abs(rel(r[key], r["truth"])) for r in rows]
        ratio = statistics.median(theirs) / max(statistics.median(ours), floor)
        worse = sum(t > o for t, o in zip(theirs, ours, strict=True))
        print(
            f"{label} vs estimate_memory: median error >= {ratio:,.0f}x larger; worse in {worse} of {len(rows)} cases"
        )
    goal = statistics.median(ours) <= 0.05 and max(ours) <= 0.10
    print(f"goal (median <= 5%, worst <= 10%): {'met' if goal else 'NOT met'}")
    print(
        f"estimate time per case: median {statistics.median(r['estimate_s'] for r in rows):.2f} s; ground truth {statistics.median(r['truth_s'] for r in rows):.2f} s"
    )


SEVEN_B = """
import json, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, {repo!r})
t0 = time.perf_counter()
from torch_skills.memory.models import EstimateMemoryRequest
from torch_skills.memory.worker import run
from torch_skills.runner.child import JobContext
t1 = time.perf_counter()
req = EstimateMemoryRequest(model="tests/fixtures/memory_models.py:build_llama", model_kwargs={{"config": "7b"}},
    inputs="tests/fixtures/memory_models.py:llama7b_inputs", loss="tests/fixtures/memory_models.py:next_token_loss",
    precision={precision!r}, optimizer="adamw")
res = run(req, JobContext(Path(tempfile.mkdtemp()), "cpu", [{repo!r}], {repo!r}))
t2 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "estimate_s": t2 - t1, "peak": res.peak_allocated_bytes, "reserved": res.peak_reserved_bytes,
    "params": res.parameter_count, "phase": res.peak_phase, "module": res.peak_module, "breakdown": res.breakdown.model_dump()}}))
"""


def time_7b(precision: str) -> None:
    """Estimate the 7B decoder in a child process; report its time and peak RSS."""
    started = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out = subprocess.run(
        [sys.executable, "-c", SEVEN_B.format(repo=str(REPO), precision=precision)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={**os.environ, "TORCH_SKILLS_NO_PREWARM": "1"},
    )
    wall = time.perf_counter() - started
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    data = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"7B ({data['params']:,} parameters, {precision}, AdamW, batch 1 x 2048 tokens): estimate {data['estimate_s']:.1f} s "
        f"(+ {data['import_s']:.1f} s to import torch), child wall {wall:.1f} s, child peak RSS {rss / 2**30:.2f} GiB"
        f"{' (an earlier child set the maximum)' if before * 1024 >= rss else ''}"
    )
    print(
        f"   peak {data['peak'] / 2**30:.1f} GiB allocated, {data['reserved'] / 2**30:.1f} GiB reserved, in {data['phase']}"
        f"{' at ' + data['module'] if data['module'] else ''}; breakdown GiB: "
        + ", ".join(f"{k} {v / 2**30:.1f}" for k, v in data["breakdown"].items())
    )
    print(f"   goal <= 60 s and <= 2 GB: {'met' if data['estimate_s'] <= 60 and rss <= 2e9 else 'NOT met'}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--skip-7b", action="store_true")
    p.add_argument("--one", help=argparse.SUPPRESS)  # model:mode:precision, used for fresh CUDA processes
    args = p.parse_args()
    device = (
        "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    )
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    if args.one:
        print(json.dumps(run_case(*args.one.split(":"), device)))
        return
    print(
        f"ground truth on {device}: "
        + (
            "torch.cuda.max_memory_allocated / max_memory_reserved, fresh process per case"
            if device == "cuda"
            else "peak live CPU-allocator bytes from the profiler's allocation events"
        )
    )
    print(f"torch {torch.__version__}\n")
    rows = []
    for case in cases(device):
        rows.append(run_in_fresh_process(case, device) if device == "cuda" else run_case(*case, device))
        print(f"  measured {':'.join(case)}", file=sys.stderr, flush=True)
    print_table(rows, device)
    if not args.skip_7b:
        print()
        for precision in ("bf16", "fp32"):
            time_7b(precision)


if __name__ == "__main__":
    main()
