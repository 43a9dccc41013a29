"""Start-up cost of the torch-skills server, measured the way a client sees it.

Run from the repository root (about 2 minutes on 2 cores):

    python bench/startup.py [--runs 9] [--call-runs 5]

Prints three tables, each against a baseline measured in the same run:
  1. launch -> first `tools/list` answer over stdio, `python server.py` against a bare MCPServer
     with one tool (the floor any Python MCP server pays: the interpreter, the SDK, stdio), both
     spawned as a client spawns them, interleaved; median, min, max and the ratio (goal <= 1.2);
  2. the first tool call after start-up: the server is launched with its defaults (the warm
     torch worker prewarmed), `tools/list` is answered, then `check_gradients` on
     bench/tiny_mlp.py is sent at once; the seconds from sending it to its result (goal <= 2 s),
     next to a warm call on the same server and a cold `python -c "import torch"`;
  3. `--help`: `python server.py --help` against `python -c pass`;
  4. the CPU seconds (not wall) a process spends importing and building each server, the bare
     one against torch-skills (`build_server()` without the worker): the start-up work itself,
     much less sensitive to other load on the machine than the wall-clock ratio of table 1.
The load average before and after is printed: on a shared machine the absolute times move with
the load, the ratios much less.

Known limitations: a machine busy with other work inflates the first-call figure most, since the
worker's `import torch` then competes for a core.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

REPO = Path(__file__).resolve().parents[1]
CALL = ("check_gradients", {"model": "bench/tiny_mlp.py:build", "inputs": "bench/tiny_mlp.py:make_inputs"})

CPU_OURS = """
import sys, time
sys.path.insert(0, sys.argv[1])
import server
from torch_skills import cli
from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR
from torch_skills.server import build_server
build_server(DEFAULT_SKILLS_DIR, prewarm=False)
print(time.process_time())
"""

BARE_SERVER = '''
from mcp.server.mcpserver import MCPServer
mcp = MCPServer("bare")

@mcp.tool()
def ping() -> str:
    """Answer pong."""
    return "pong"

mcp.run()
'''
CPU_BARE = BARE_SERVER.replace("mcp.run()", "import time\nprint(time.process_time())")


def _params(args: list[str]) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=args, cwd=str(REPO))


async def time_to_first_list(args: list[str]) -> float:
    started = time.perf_counter()
    async with Client(_params(args)) as client:
        tools = await client.list_tools()
        elapsed = time.perf_counter() - started
        assert tools.tools
    return elapsed


async def first_and_warm_call() -> tuple[float, float, float]:
    """(launch -> tools/list, first call right after it, a warm call) on a server with its defaults."""
    started = time.perf_counter()
    async with Client(_params([str(REPO / "server.py")])) as client:
        await client.list_tools()
        listed = time.perf_counter() - started
        t0 = time.perf_counter()
        first = await client.call_tool(*CALL)
        first_s = time.perf_counter() - t0
        assert not first.is_error, first.content
        t0 = time.perf_counter()
        await client.call_tool(*CALL)
        warm_s = time.perf_counter() - t0
    return listed, first_s, warm_s


def _timed_process(args: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(args, cwd=REPO, check=True, capture_output=True)
    return time.perf_counter() - started


def _cpu_seconds(args: list[str]) -> float:
    out = subprocess.run([sys.executable, *args], cwd=REPO, check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def _row(name: str, values: list[float]) -> str:
    return f"{name:40} {statistics.median(values):9.3f} {min(values):7.3f} {max(values):7.3f}"


def _header(title: str) -> None:
    print(f"\n{title}")
    print(f"{'':40} {'median s':>9} {'min s':>7} {'max s':>7}")


async def main(runs: int, call_runs: int) -> None:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        bare = Path(tmp) / "bare_server.py"
        bare.write_text(BARE_SERVER)
        cases = {"bare MCPServer (1 tool)": [str(bare)], "torch-skills server.py": [str(REPO / "server.py")]}
        lists: dict[str, list[float]] = {name: [] for name in cases}
        await time_to_first_list(cases["bare MCPServer (1 tool)"])  # warm the OS file cache once
        await time_to_first_list(cases["torch-skills server.py"])
        for _ in range(runs):
            for name, args in cases.items():  # interleaved, so drift hits both alike
                lists[name].append(await time_to_first_list(args))

    _header(f"1. launch -> first tools/list answer over stdio ({runs} runs each, interleaved)")
    for name, values in lists.items():
        print(_row(name, values))
    ratio = statistics.median(lists["torch-skills server.py"]) / statistics.median(
        lists["bare MCPServer (1 tool)"]
    )
    print(f"ratio torch-skills / bare (medians): {ratio:.2f} (goal <= 1.2)")

    firsts, warms, listed = [], [], []
    for _ in range(call_runs):
        list_s, first_s, warm_s = await first_and_warm_call()
        listed.append(list_s)
        firsts.append(first_s)
        warms.append(warm_s)
    cold = [_timed_process([sys.executable, "-c", "import torch"]) for _ in range(3)]
    _header(
        f"2. first tool call right after start-up ({call_runs} launches; check_gradients on bench/tiny_mlp.py)"
    )
    print(_row("launch -> tools/list (defaults, prewarm)", listed))
    print(_row("first call, sent right after tools/list", firsts))
    print(_row("warm call on the same server", warms))
    print(_row("baseline: python -c 'import torch'", cold))
    print(f"first call median {statistics.median(firsts):.2f} s (goal <= 2 s)")

    helps = [_timed_process([sys.executable, str(REPO / "server.py"), "--help"]) for _ in range(runs)]
    floor = [_timed_process([sys.executable, "-c", "pass"]) for _ in range(runs)]
    _header("3. --help")
    print(_row("python server.py --help", helps))
    print(_row("baseline: python -c pass", floor))

    cpu_bare, cpu_ours = [], []
    for _ in range(runs):  # interleaved
        cpu_bare.append(_cpu_seconds(["-c", CPU_BARE]))
        cpu_ours.append(_cpu_seconds(["-c", CPU_OURS, str(REPO)]))
    _header("4. CPU seconds to import and build the server (no stdio, no worker)")
    print(_row("bare MCPServer (1 tool)", cpu_bare))
    print(_row("torch-skills build_server()", cpu_ours))
    print(f"ratio (medians): {statistics.median(cpu_ours) / statistics.median(cpu_bare):.2f}")
    print(
        f"\nload average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--call-runs", type=int, default=5)
    args = parser.parse_args()
    anyio.run(main, args.runs, args.call_runs)
