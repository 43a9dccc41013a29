"""Load on the HTTP server: many route calls at once, a burst of check_gradients, a long sequence.

Run from the repository root (a few minutes on 2 cores):

    python bench/load.py [--clients 20] [--calls 100] [--gradients 32] [--sequential 300]

It starts `python server.py --transport http` on 127.0.0.1 (with a bearer token made for the run,
sent by every client) and measures, in one run:
  1. --clients concurrent MCP clients, each making --calls `route` calls;
  2. --gradients concurrent `check_gradients` calls on bench/tiny_mlp.py (queued on the
     server's --max-jobs workers);
  3. --sequential `route` calls one after the other from one client;
and prints p50/p99 latency and the error count per phase, the server's RSS after warm-up and at
the end (growth in %), and how many processes below the server are left besides its warm worker
once the calls are done (the goal: 0 errors, RSS growth <= 10%, 0 children left).

Known limitations: the machine may be shared with other work, so latencies move with its load;
the error count, RSS growth and children left are what this is for.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

REPO = Path(__file__).resolve().parents[1]
QUERIES = [
    "CUDA out of memory when training with batch size 64",
    "loss becomes nan after a few hundred steps",
    "NCCL timeout on 8 nodes",
    "torch.load says Weights only load failed",
    "my training loop is slow, GPU utilisation is 30%",
]


TOKEN = secrets.token_urlsafe(24)  # the server needs a bearer token; this run gives it one


@contextlib.asynccontextmanager
async def _client(url: str):
    """An MCP client that sends the bearer token on every request."""
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=600)) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        yield client


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read()
                children.setdefault(int(stat[stat.rfind(")") + 2 :].split()[1]), []).append(int(name))
            except (OSError, ValueError, IndexError):
                continue
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


async def _timed(client: Client, tool: str, args: dict, latencies: list[float], errors: list[str]) -> None:
    started = time.perf_counter()
    try:
        result = await client.call_tool(tool, args)
        if result.is_error:
            errors.append(result.content[0].text[:200])
    except Exception as e:  # noqa: BLE001 - a transport failure is an error of the run
        errors.append(f"{type(e).__name__}: {e}"[:200])
    latencies.append(time.perf_counter() - started)


def _row(name: str, latencies: list[float], errors: list[str], wall: float) -> str:
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return (
        f"{name:<34} {len(latencies):>6} {len(errors):>6} {q[49] * 1000:>9.1f} {q[98] * 1000:>9.1f} "
        f"{len(latencies) / wall:>8.1f}"
    )


async def main(args: argparse.Namespace) -> int:
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "server.py", "--transport", "http", "--port", str(port), "--max-jobs", "2"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "TORCH_SKILLS_TOKEN": TOKEN},
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 60
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            if time.monotonic() > deadline:
                raise SystemExit("the server did not start")
            await asyncio.sleep(0.1)
        gradient_args = {"model": "bench/tiny_mlp.py:build", "input_shape": [8, 64], "timeout_s": 600}
        async with _client(url) as warm:  # warm-up: the torch worker and the first route
            await warm.call_tool("route", {"query": QUERIES[0]})
            await warm.call_tool("check_gradients", gradient_args)
        rss_start = _rss_bytes(server.pid)
        rows = []

        lat: list[float] = []
        err: list[str] = []
        started = time.perf_counter()

        async def one_client(i: int) -> None:
            async with _client(url) as client:
                for j in range(args.calls):
                    await _timed(client, "route", {"query": QUERIES[(i + j) % len(QUERIES)]}, lat, err)

        await asyncio.gather(*(one_client(i) for i in range(args.clients)))
        rows.append(
            _row(f"{args.clients} clients x {args.calls} route", lat, err, time.perf_counter() - started)
        )
        errors = list(err)

        lat, err = [], []
        started = time.perf_counter()
        async with _client(url) as client:
            await asyncio.gather(
                *(_timed(client, "check_gradients", gradient_args, lat, err) for _ in range(args.gradients))
            )
        rows.append(
            _row(f"{args.gradients} concurrent check_gradients", lat, err, time.perf_counter() - started)
        )
        errors += err

        lat, err = [], []
        started = time.perf_counter()
        async with _client(url) as client:
            for j in range(args.sequential):
                await _timed(client, "route", {"query": QUERIES[j % len(QUERIES)]}, lat, err)
        rows.append(_row(f"{args.sequential} sequential route", lat, err, time.perf_counter() - started))
        errors += err

        await asyncio.sleep(1.0)
        rss_end = _rss_bytes(server.pid)
        below = _descendants(server.pid)
        workers = [p for p in below if "runner.zygote" in _cmdline(p)]
        left = [p for p in below if p not in workers]
        print(f"{'phase':<34} {'calls':>6} {'errors':>6} {'p50 ms':>9} {'p99 ms':>9} {'calls/s':>8}")
        for row in rows:
            print(row)
        growth = (rss_end - rss_start) / rss_start * 100
        print(
            f"server RSS after warm-up {rss_start / 2**20:.1f} MiB, at the end {rss_end / 2**20:.1f} MiB: {growth:+.1f}%"
        )
        print(f"processes below the server besides the warm worker: {len(left)}")
        for e in errors[:5]:
            print("error:", e)
        return 0 if not errors and not left else 1
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--gradients", type=int, default=32)
    p.add_argument("--sequential", type=int, default=300)
    sys.exit(asyncio.run(main(p.parse_args())))
