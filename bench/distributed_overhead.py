"""What a check_distributed call costs against a hand-written two-process gloo run of the same steps.

Run from the repository root (a minute or two on 2 cores):

    python bench/distributed_overhead.py [--calls 5] [--hand-runs 5] [--steps 3]

In the same run, on bench/tiny_mlp.py (global batch 32, two ranks, DDP, SGD):
  1. the tool: check_distributed through an in-memory MCP client on the real server; the first
     call (which waits for the warm worker's imports) is reported apart, then the median of
     --calls warm calls. Each call also runs a probe step, the one-process reference and the
     cross-rank comparisons;
  2. by hand: a script running torch.multiprocessing.spawn with two processes, each joining a
     gloo group, wrapping the model in DDP and running the same steps on its half of the batch;
     timed from outside (interpreter start to exit), median of --hand-runs. The time from spawn
     to join alone (the children's imports included, the parent's not) is reported beside it.
It prints a table and the ratio tool / hand (goal: at most 1.5).

Known limitations: the machine is shared, so absolute numbers move with its load; the ratio is
measured side by side in one run. Figures whose IQR is above 10% of the median are marked noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL = "bench/tiny_mlp.py:build"
INPUTS = "bench/tiny_mlp.py:make_inputs"

HAND = r"""
import os, sys, tempfile, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
STEPS = int(sys.argv[1])


def rank_main(rank, world, store_path):
    from tiny_mlp import build, make_inputs

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(build())
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x = make_inputs().chunk(world)[rank]
    for _ in range(STEPS):
        model(x).mean().backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        start = time.perf_counter()
        mp.spawn(rank_main, args=(2, os.path.join(d, "store")), nprocs=2)
        print(time.perf_counter() - start)
"""


def summarize(samples: list[float]) -> tuple[float, float]:
    """(median, interquartile range)."""
    if len(samples) < 4:
        return statistics.median(samples), 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4)
    return statistics.median(samples), q3 - q1


async def tool_calls(calls: int, steps: int) -> tuple[float, list[float]]:
    from mcp import Client

    sys.path.insert(0, str(REPO_ROOT / "tools"))
    from torch_skills.server import build_server

    arguments = {"model": MODEL, "inputs": INPUTS, "world_size": 2, "steps": steps}
    os.chdir(REPO_ROOT)
    async with Client(build_server()) as client:
        start = time.perf_counter()
        first = await client.call_tool("check_distributed", arguments)
        first_s = time.perf_counter() - start
        if first.is_error or first.structured_content["findings"]:
            raise SystemExit(f"check_distributed did not run cleanly: {first.content[0].text[:500]}")
        warm = []
        for _ in range(calls):
            start = time.perf_counter()
            r = await client.call_tool("check_distributed", arguments)
            warm.append(time.perf_counter() - start)
            assert not r.is_error
    return first_s, warm


def hand_runs(runs: int, steps: int) -> tuple[list[float], list[float]]:
    outside, inside = [], []
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "hand_ddp.py"  # a file: spawn re-imports __main__ in each child
        script.write_text(HAND)
        for _ in range(runs):
            start = time.perf_counter()
            done = subprocess.run(
                [sys.executable, str(script), str(steps)], cwd=REPO_ROOT, capture_output=True, text=True
            )
            outside.append(time.perf_counter() - start)
            if done.returncode:
                raise SystemExit(f"the hand-written run failed:\n{done.stderr[-2000:]}")
            inside.append(float(done.stdout.strip().splitlines()[-1]))
    return outside, inside


def row(name: str, samples: list[float]) -> str:
    median, iqr = summarize(samples)
    noisy = "  (noisy)" if iqr > 0.1 * median else ""
    return f"| {name:<44} | {median:8.3f} s | {iqr:7.3f} s | {len(samples):3d} |{noisy}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--hand-runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    first, warm = asyncio.run(tool_calls(args.calls, args.steps))
    outside, inside = hand_runs(args.hand_runs, args.steps)
    print(f"two ranks, DDP, gloo, {args.steps} steps of bench/tiny_mlp.py (global batch 32)\n")
    print("| what | median | IQR | n |\n|---|---|---|---|")
    print(row("check_distributed, first call (worker starting)", [first]))
    print(row("check_distributed, warm call", warm))
    print(row("by hand: python hand_ddp.py (whole command)", outside))
    print(row("by hand: spawn to join only", inside))
    tool = summarize(warm)[0]
    print(f"\nratio tool / hand (whole command): {tool / summarize(outside)[0]:.2f}  (goal <= 1.5)")
    print(f"ratio tool / hand (spawn to join): {tool / summarize(inside)[0]:.2f}")


if __name__ == "__main__":
    main()
