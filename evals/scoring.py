"""Collects eval scores during a `pytest evals/` run and renders the score table.

Tests call `record_routing(...)` / `record_scenario(...)`; the `pytest_terminal_summary` hook in
evals/conftest.py prints `render_markdown()` and writes it to evals/report.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import jinja2

TEMPLATE = Path(__file__).with_name("report.md.j2")


@dataclass
class RoutingScore:
    """One query set's figures. Labels: a skill name, "clarify" or "decline" (out of scope)."""

    name: str
    total: int = 0
    correct: int = 0
    clarify_expected: int = 0
    clarify_correct: int = 0
    next_expected: int = 0
    next_found: int = 0
    clarify_asked: int = 0  # times route asked, expected or not (clarify precision)
    decline_expected: int = 0
    decline_correct: int = 0
    declined: int = 0  # times route declined, expected or not (decline precision)
    routable: int = 0  # queries labelled with a skill
    routable_correct: int = 0  # ... whose first skill was right
    routable_declined: int = 0  # ... that route declined: the worst miss
    by_kind: dict[str, tuple[int, int]] = field(default_factory=dict)  # kind -> (correct, total)
    misses: list[tuple[str, str, str]] = field(default_factory=list)  # (query, expected, got)

    def add(self, expected: str, got: str) -> bool:
        """Count one routed query (got: a skill, "clarify" or "decline"); return whether it was right."""
        ok = got == expected
        self.total += 1
        self.correct += ok
        self.clarify_expected += expected == "clarify"
        self.clarify_correct += ok and expected == "clarify"
        self.clarify_asked += got == "clarify"
        self.decline_expected += expected == "decline"
        self.decline_correct += ok and expected == "decline"
        self.declined += got == "decline"
        if expected not in ("clarify", "decline"):
            self.routable += 1
            self.routable_correct += ok
            self.routable_declined += got == "decline"
        return ok

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0


def ratio(num: int, den: int) -> str:
    """'12/13 (92.3%)', or '-' when nothing was counted."""
    return f"{num}/{den} ({100 * num / den:.1f}%)" if den else "-"


@dataclass
class ScenarioScore:
    tool: str
    scenario: str
    passed: bool
    detail: str
    seconds: float


ROUTING: list[RoutingScore] = []
SCENARIOS: list[ScenarioScore] = []


def record_routing(score: RoutingScore) -> None:
    ROUTING.append(score)


def record_scenario(score: ScenarioScore) -> None:
    SCENARIOS.append(score)


def render_markdown() -> str:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    tools: dict[str, list[ScenarioScore]] = {}
    for s in SCENARIOS:
        tools.setdefault(s.tool, []).append(s)
    return env.from_string(TEMPLATE.read_text()).render(
        routing=ROUTING, tools=tools, scenarios=SCENARIOS, ratio=ratio
    )
