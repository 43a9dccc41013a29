"""What profile_model costs over timing the same steps by hand, and whether its overhead figure holds.

Run: python bench/profile_overhead.py [--runs 3] [--cpu-threads 1]

For each model of evals/models/profile_model_scenarios.py, measured in the same run, interleaved:
- by hand: this script builds the model and batch and times warmup + active steps with
  perf_counter (the floor any measurement pays), then times the same active steps under
  torch.profiler (CPU activity) to get the profiler's overhead independently of the tool;
- the tool: profile_model over the in-memory MCP client, on a warm worker (fork, build, timed pass,
  calibration, probe step, profiled pass, classification).
Prints the medians and the ratios: tool wall / by-hand wall, the tool's step time / the hand-timed
step time, and the profiler overhead the tool reports against the one measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch
from mcp import Client
from torch.profiler import ProfilerActivity, profile

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import server  # noqa: E402,F401  (registers torch_skills from this clone)
from torch_skills.server import build_server  # noqa: E402

MODELS_FILE = REPO / "evals" / "models" / "profile_model_scenarios.py"
WARMUP, ACTIVE = 3, 10  # the tool's defaults
CASES = [  # (factory, input shape, mode)
    ("tiny_ops", [4, 16], "train"),
    ("flops_mlp", [32, 64], "train"),
    ("big_matmul", [512, 1024], "inference"),
    ("elementwise", [64, 16384], "inference"),
]


def _models():
    spec = importlib.util.spec_from_file_location("profile_model_scenarios", MODELS_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def by_hand(models, factory: str, shape: list[int], mode: str) -> dict[str, float]:
    """Wall time of building and timing the steps in this process, step median, profiled median."""
    started = time.perf_counter()
    model = getattr(models, factory)()
    x = torch.randn(shape)  # (B, ...)
    if mode == "train":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step() -> None:
            model(x).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    else:
        model.eval()

        def step() -> None:
            with torch.inference_mode():
                model(x)

    for _ in range(WARMUP):
        step()
    times = []
    for _ in range(ACTIVE):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    wall = time.perf_counter() - started
    profiled = []
    with profile(activities=[ProfilerActivity.CPU]):
        for _ in range(ACTIVE):
            t0 = time.perf_counter()
            step()
            profiled.append(time.perf_counter() - t0)
    return {"wall": wall, "step": statistics.median(times), "profiled": statistics.median(profiled)}


async def by_tool(client: Client, factory: str, shape: list[int], mode: str, threads: int | None) -> dict:
    started = time.perf_counter()
    args = {"model": f"evals/models/profile_model_scenarios.py:{factory}", "input_shape": shape, "mode": mode}
    if threads is not None:
        args["cpu_threads"] = threads
    r = await client.call_tool("profile_model", args)
    wall = time.perf_counter() - started
    if r.is_error:
        raise RuntimeError(r.content[0].text)
    s = r.structured_content
    return {
        "wall": wall,
        "worker": s["run"]["wall_time_s"],
        "step": s["step_time_s"],
        "overhead": s["profiler_overhead_ratio"],
        "bottleneck": s["bottleneck"],
    }


async def main(runs: int, threads: int | None) -> None:
    if threads is not None:
        torch.set_num_threads(threads)
    models = _models()
    ready: asyncio.Future = asyncio.get_running_loop().create_future()
    done = asyncio.Event()

    async def hold() -> None:
        async with Client(build_server()) as c:  # one task owns the client's cancel scopes
            ready.set_result(c)
            await done.wait()

    holder = asyncio.create_task(hold())
    client = await ready
    await by_tool(client, "flops_mlp", [32, 64], "inference", threads)  # warm the worker and imports once
    rows = []
    for factory, shape, mode in CASES:
        hand, tool = [], []
        for _ in range(runs):  # interleaved, so drift hits both alike
            hand.append(by_hand(models, factory, shape, mode))
            tool.append(await by_tool(client, factory, shape, mode, threads))
        med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
        rows.append((f"{factory} ({mode})", med(hand, "wall"), med(tool, "wall"), med(tool, "worker"),
                     med(hand, "step"), med(tool, "step"), med(hand, "profiled") / med(hand, "step"),
                     med(tool, "overhead"), tool[-1]["bottleneck"]))  # fmt: skip
    done.set()
    await holder
    print(f"profile_model vs the same {WARMUP}+{ACTIVE} steps by hand, median of {runs} runs, "
          f"torch threads: {torch.get_num_threads()}")  # fmt: skip
    header = (f"{'model':26} {'hand s':>7} {'tool s':>7} {'worker s':>8} {'tool/hand':>9} "
              f"{'hand step':>10} {'tool step':>10} {'step ratio':>10} {'prof ovh hand':>13} "
              f"{'prof ovh tool':>13}  bottleneck")  # fmt: skip
    print(header)
    for name, hand_wall, tool_wall, worker, hand_step, tool_step, hand_ovh, tool_ovh, verdict in rows:
        print(f"{name:26} {hand_wall:7.3f} {tool_wall:7.3f} {worker:8.3f} {tool_wall / hand_wall:9.1f} "
              f"{hand_step * 1e3:8.3f}ms {tool_step * 1e3:8.3f}ms {tool_step / hand_step:10.2f} "
              f"{hand_ovh:13.2f} {tool_ovh:13.2f}  {verdict}")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cpu-threads", type=int, default=None)
    options = parser.parse_args()
    asyncio.run(main(options.runs, options.cpu_threads))
