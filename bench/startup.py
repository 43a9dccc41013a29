"""Start-up cost of the torch-skills server: launch to first `tools/list` answer over stdio.

Run: python bench/startup.py [--runs 7]

Baseline, measured in the same run: a bare MCPServer with one tool (the floor any MCP server
pays: Python, the SDK, stdio). Prints the median of each and their ratio (goal: <= 1.3).
Both are launched the way a client launches them, as a subprocess speaking stdio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

REPO = Path(__file__).resolve().parents[1]

BARE_SERVER = '''
from mcp.server.mcpserver import MCPServer
mcp = MCPServer("bare")

@mcp.tool()
def ping() -> str:
    """Answer pong."""
    return "pong"

mcp.run()
'''


async def time_to_first_list(args: list[str]) -> float:
    started = time.perf_counter()
    async with Client(StdioServerParameters(command=sys.executable, args=args, cwd=str(REPO))) as client:
        tools = await client.list_tools()
        elapsed = time.perf_counter() - started
        assert tools.tools
    return elapsed


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        bare = Path(tmp) / "bare_server.py"
        bare.write_text(BARE_SERVER)
        cases = {
            "bare MCPServer (1 tool)": [str(bare)],
            "torch-skills server.py": [str(REPO / "server.py")],
        }
        timings: dict[str, list[float]] = {name: [] for name in cases}
        await time_to_first_list(cases["bare MCPServer (1 tool)"])  # warm the OS file cache once
        for _ in range(runs):
            for name, args in cases.items():  # interleaved, so drift hits both alike
                timings[name].append(await time_to_first_list(args))
    print(f"launch -> first tools/list answer over stdio, median of {runs} runs")
    print(f"{'server':28} {'median s':>9} {'min s':>7} {'max s':>7}")
    medians = {}
    for name, values in timings.items():
        medians[name] = statistics.median(values)
        print(f"{name:28} {medians[name]:9.3f} {min(values):7.3f} {max(values):7.3f}")
    ratio = medians["torch-skills server.py"] / medians["bare MCPServer (1 tool)"]
    print(f"ratio torch-skills / bare: {ratio:.2f} (goal <= 1.3)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    anyio.run(main, parser.parse_args().runs)
