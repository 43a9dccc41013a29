"""What a check_gradients call costs: over stdio against a cold `python -c`, and inside the worker.

Run from the repository root (about a minute on 2 cores):

    python bench/tool_overhead.py [--calls 30] [--cold-runs 5] [--threads N]

It measures, all in the same run:
  1. end to end: `python server.py` spawned over stdio with the MCP client; the median of warm
     check_gradients calls on bench/tiny_mlp.py (the first call, which waits for the torch
     worker to start, is reported apart);
  2. the cold baseline: `python -c "import torch; ..."` building the same MLP and doing one
     forward + backward and the gradient norms, timed from outside, median of --cold-runs;
  3. inside the worker: the tool's own wall time and its hooked forward+backward (from the
     result's run/timings fields) against a plain build + forward+backward of the same model
     in a fresh fork of a process warmed up like the zygote (what the tool's child starts
     from), and in this process on a fresh model and warm (the step repeated).
and prints a table and the ratios. Figures with an IQR above 10% of the median are marked noisy.

--threads N sets OMP_NUM_THREADS for the server (and so its worker), the cold runs and this
process alike. On a machine whose cores are busy with other work, intra-op threads wait for each
other and small steps slow down by tens of milliseconds; --threads 1 shows the cost without that.

Known limitations: the machine is shared, so absolute numbers move with its load; compare the
ratios, which are measured side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL = "bench/tiny_mlp.py:build"
INPUTS = "bench/tiny_mlp.py:make_inputs"
COLD_CODE = (
    "import sys, torch; sys.path.insert(0, 'bench'); from tiny_mlp import build, make_inputs; "
    "m = build(); x = make_inputs(); m(x).mean().backward(); "
    "print(float(sum(p.grad.norm() ** 2 for p in m.parameters()) ** 0.5))"
)


def summarize(samples: list[float]) -> tuple[float, float]:
    """(median, interquartile range)."""
    if len(samples) < 4:
        return statistics.median(samples), 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4)
    return statistics.median(samples), q3 - q1


async def stdio_calls(calls: int) -> tuple[float, list[float], list[dict]]:
    """(first call seconds, warm call seconds, warm structured results) over a real stdio server."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    env = {"OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"]} if "OMP_NUM_THREADS" in os.environ else None
    params = StdioServerParameters(command=sys.executable, args=["server.py"], cwd=str(REPO_ROOT), env=env)
    arguments = {"model": MODEL, "inputs": INPUTS}
    async with Client(params) as client:
        start = time.perf_counter()
        first = await client.call_tool("check_gradients", arguments)
        first_s = time.perf_counter() - start
        if first.is_error:
            raise SystemExit(f"check_gradients failed: {first.content}")
        warm, results = [], []
        for _ in range(calls):
            start = time.perf_counter()
            r = await client.call_tool("check_gradients", arguments)
            warm.append(time.perf_counter() - start)
            results.append(r.structured_content)
    return first_s, warm, results


def cold_runs(runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", COLD_CODE], cwd=REPO_ROOT, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def plain_forked(repeats: int) -> list[float]:
    """Build + one forward+backward in fresh forks of a process warmed up like the worker's zygote."""
    sys.path.insert(0, str(REPO_ROOT))
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    from tiny_mlp import build, make_inputs

    import server  # noqa: F401  (registers torch_skills from this clone)
    from torch_skills.gradients.worker import warm_up

    warm_up()  # the zygote's state: torch and the tool loaded, tiny ops run once
    times = []
    for _ in range(repeats):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: time one step, report it, leave without cleanup
            os.close(read_fd)
            start = time.perf_counter()
            build()(make_inputs()).mean().backward()
            os.write(write_fd, repr(time.perf_counter() - start).encode())
            os._exit(0)
        os.close(write_fd)
        with os.fdopen(read_fd) as f:
            times.append(float(f.read()))
        os.waitpid(pid, 0)
    return times


def plain_steps(repeats: int) -> tuple[list[float], list[float]]:
    """(fresh model: build + one forward+backward, warm: forward+backward repeated) in this process."""
    import torch

    sys.path.insert(0, str(REPO_ROOT / "bench"))
    from tiny_mlp import build, make_inputs

    x = make_inputs()

    def step(model: torch.nn.Module) -> None:
        model(x).mean().backward()

    def timed(fn: Callable[[], None]) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    step(build())  # first-use costs of the kernels, paid once by the warm worker too
    fresh = [timed(lambda: step(build())) for _ in range(repeats)]
    model = build()
    warm = [timed(lambda m=model: step(m)) for _ in range(repeats)]
    return fresh, warm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30, help="warm check_gradients calls over stdio")
    parser.add_argument("--cold-runs", type=int, default=5, help="cold `python -c` runs")
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for every process")
    args = parser.parse_args()
    if args.threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # read by torch at import, in every process
    print(
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores, OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS', 'unset')}"
    )

    first_s, warm, results = asyncio.run(stdio_calls(args.calls))
    cold = cold_runs(args.cold_runs)
    forked = plain_forked(args.calls)
    fresh, plain = plain_steps(200)
    in_worker = [r["run"]["wall_time_s"] for r in results]
    hooked = [r["timings"]["forward_s"] + r["timings"]["backward_s"] for r in results]

    rows = [
        ("stdio check_gradients, first call (worker start)", [first_s]),
        ("stdio check_gradients, warm call", warm),
        ("cold python -c: import torch + same step", cold),
        ("in-worker wall time of the tool (fork to result)", in_worker),
        ("in-worker hooked forward+backward", hooked),
        ("plain build + forward+backward, fresh fork", forked),
        ("plain build + forward+backward, fresh model", fresh),
        ("plain forward+backward, warm", plain),
    ]
    stats = {name: summarize(samples) for name, samples in rows}
    print(f"{'measurement':52s} {'n':>4s} {'median':>10s} {'IQR':>10s}")
    for name, samples in rows:
        median, iqr = stats[name]
        noisy = "  noisy" if median and iqr > 0.1 * median else ""
        print(f"{name:52s} {len(samples):4d} {median * 1e3:8.2f}ms {iqr * 1e3:8.2f}ms{noisy}")

    def ratio(a: str, b: str) -> float:
        return stats[a][0] / stats[b][0]

    print()
    print(f"cold python -c / warm stdio call:            {ratio(rows[2][0], rows[1][0]):8.1f}x")
    print(f"warm stdio call / in-worker wall time:       {ratio(rows[1][0], rows[3][0]):8.2f}x")
    print(f"in-worker wall time / plain step in a fork:  {ratio(rows[3][0], rows[5][0]):8.2f}x")
    print(f"in-worker wall time / plain fresh model:     {ratio(rows[3][0], rows[6][0]):8.1f}x")
    print(f"hooked forward+backward / plain warm step:   {ratio(rows[4][0], rows[7][0]):8.2f}x")


if __name__ == "__main__":
    main()
