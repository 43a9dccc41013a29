"""The verify_checkpoint eval scenarios pass against the real server (until a generic eval runner lands)."""

from __future__ import annotations

import pytest

from evals.framework import check
from evals.scenarios.verify_checkpoint import SCENARIOS


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.id for s in SCENARIOS])
async def test_the_scenario_passes(client, scenario):
    """Every expectation of the scenario holds on the tool's structured result (or its error)."""
    r = await client.call_tool(scenario.tool, scenario.arguments)
    if scenario.expect_error is not None:
        assert r.is_error and scenario.expect_error in r.content[0].text
        return
    assert not r.is_error, r.content
    failed = [
        (e.describe(), actual)
        for e in scenario.expect
        for ok, actual in [check(e, r.structured_content)]
        if not ok
    ]
    assert failed == []
