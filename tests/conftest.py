"""Shared fixtures: one in-memory MCP client on the real server for the whole test session."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client

from tests.owned import entered_in_own_task
from torch_skills.gradients.models import GradientRequest, GradientResult
from torch_skills.gradients.worker import run as run_check_gradients
from torch_skills.runner.child import JobContext
from torch_skills.server import build_server
from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR, SkillPack
from torch_skills.skillpack.route import Router

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT / "tests" / "fixtures"


@pytest.fixture(scope="session")
async def client() -> AsyncIterator[Client]:
    """An in-memory Client connected to build_server(); its warm worker is shared by all tests."""
    async with entered_in_own_task(lambda: Client(build_server(allow=[FIXTURES]))) as c:
        yield c


@pytest.fixture(scope="session")
def router() -> Router:
    """The router the server ships, built from the router skill's tables (tests/test_route*.py)."""
    return Router.from_pack(SkillPack.load(DEFAULT_SKILLS_DIR))


@pytest.fixture
def check(tmp_path: Path):
    """Run check_gradients in this process (tests/test_gradients_zoo.py, test_gradients_real_bugs.py): `check(model=..., input_shape=...)` -> GradientResult."""

    def call(**arguments) -> GradientResult:
        job = JobContext(tmp_path, "cpu", [str(REPO_ROOT)], str(REPO_ROOT))
        return run_check_gradients(GradientRequest(**arguments), job)

    return call
