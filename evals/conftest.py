"""`pytest evals/`: scores routing and tool diagnoses through the MCP server, prints the table."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client

from evals import scoring
from tests.owned import entered_in_own_task
from torch_skills.server import build_server

REPORT = Path(__file__).with_name("report.md")


@pytest.fixture(scope="session")
async def client() -> AsyncIterator[Client]:
    """An in-memory client on the real server, shared by every eval."""
    async with entered_in_own_task(lambda: Client(build_server())) as c:
        yield c


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not scoring.ROUTING and not scoring.SCENARIOS:
        return
    report = scoring.render_markdown()
    REPORT.write_text(report)
    terminalreporter.write_sep("=", "torch-skills eval scores")
    terminalreporter.write_line(report)
    terminalreporter.write_line(f"(written to {REPORT})")
