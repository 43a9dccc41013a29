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
    name: str
    total: int
    correct: int
    clarify_expected: int
    clarify_correct: int
    next_expected: int
    next_found: int
    by_kind: dict[str, tuple[int, int]] = field(default_factory=dict)  # kind -> (correct, total)
    misses: list[tuple[str, str, str]] = field(default_factory=list)  # (query, expected, got)

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0


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
    return env.from_string(TEMPLATE.read_text()).render(routing=ROUTING, tools=tools, scenarios=SCENARIOS)
