"""Tool diagnoses on scripted scenarios (evals/scenarios/*.py), called through the MCP server."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import time

import pytest
from mcp import Client

from evals import baseline, scenarios, scoring
from evals.framework import Scenario, check


def _all_scenarios() -> list[Scenario]:
    found: list[Scenario] = []
    for module in pkgutil.iter_modules(scenarios.__path__):
        found += getattr(importlib.import_module(f"evals.scenarios.{module.name}"), "SCENARIOS", [])
    return found


SCENARIOS = _all_scenarios()


def _missing(scenario: Scenario) -> list[str]:
    return [name for name in scenario.requires if importlib.util.find_spec(name) is None]


@pytest.mark.parametrize(
    "scenario",
    [pytest.param(s, marks=[pytest.mark.slow] if s.slow else []) for s in SCENARIOS],
    ids=lambda s: f"{s.tool}:{s.id}",
)
async def test_the_tool_diagnoses_the_scenario(client: Client, scenario: Scenario):
    """The tool's structured result says what the scenario expects (or fails with the expected error)."""
    missing = _missing(scenario)
    if missing:
        pytest.skip(f"needs {', '.join(missing)}: pip install -e '.[zoo]'")
    if scenario.prepare is not None:
        scenario.prepare()
    started = time.perf_counter()
    result = await client.call_tool(scenario.tool, scenario.arguments)
    seconds = time.perf_counter() - started
    failures: list[str] = []
    if scenario.expect_error is not None:
        text = result.content[0].text if result.content else ""
        if not result.is_error:
            failures.append("expected a tool error, got a result")
        elif scenario.expect_error not in text:
            failures.append(f"error lacks {scenario.expect_error!r}: {text[:200]}")
    elif result.is_error:
        failures.append(f"tool error: {result.content[0].text[:300]}")
    else:
        for expect in scenario.expect:
            ok, actual = check(expect, result.structured_content)
            if not ok:
                failures.append(f"{expect.describe()} (got {actual!r})"[:300])
    scoring.record_scenario(
        scoring.ScenarioScore(scenario.tool, scenario.id, not failures, "; ".join(failures) or "ok", seconds)
    )
    known = baseline.load().get("scenarios", {}).get("known_failures", {})
    if failures and scenario.id in known:
        pytest.xfail(f"known failure: {known[scenario.id]}")
    assert not failures, "; ".join(failures)
