"""The router's SKILL.md parses into the tables route() reads."""

from __future__ import annotations

import pytest

from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR, ROUTER_NAME, SkillPack
from torch_skills.skillpack.router import RouterFormatError, parse_router

TOOLS = {"check_gradients", "estimate_memory", "profile_model", "verify_checkpoint"}


@pytest.fixture(scope="module")
def table():
    return parse_router(SkillPack.load(DEFAULT_SKILLS_DIR).get(ROUTER_NAME).body)


def test_every_specialist_has_a_route_section_with_phrases_of_every_kind(table):
    """Each of the eight route sections lists symptoms, error messages, example queries and keywords."""
    assert len(table.routes) == 8
    for name, section in table.routes.items():
        for kind in ("symptoms", "errors", "examples", "keywords"):
            assert section.phrases[kind], f"{name} lists no {kind}"


def test_the_tools_the_router_names_are_the_servers_diagnostic_tools(table):
    """A **Tool:** line names only tools the server has; the four diagnostics are each named."""
    named = {tool for section in table.routes.values() for tool in section.tools}
    assert named == TOOLS


def test_precedence_ambiguity_and_synonym_tables_are_read(table):
    """Cross-cutting rules, the clarifying questions and the synonyms all come from the file."""
    rule = next(r for r in table.precedence if r.source == "precedence" and "nan" in r.terms)
    assert rule.first == "debugging-techniques"
    assert "mixed-precision-and-optimization" in rule.then
    assert any(r.source == "mistakes" and r.first == "performance-profiling" for r in table.precedence)
    assert any("fix my training" in case.phrasings for case in table.ambiguous)
    assert all(case.question.endswith("?") for case in table.ambiguous)
    assert table.synonyms["vram"] == "memory"


def test_a_router_without_a_routes_section_is_a_format_error():
    """The parser says what is missing instead of routing on nothing."""
    with pytest.raises(RouterFormatError, match="Routes"):
        parse_router("# Router\n\nSome prose.\n")


def test_a_precedence_row_with_missing_cells_names_its_line():
    """A malformed table row is reported with its line number."""
    text = "## Routes\n\n### a-skill\n\n**Symptoms**\n- x\n\n## Precedence\n\n| a | b | c | d |\n|---|---|---|---|\n| nan | amp |\n"
    with pytest.raises(RouterFormatError, match="line 12"):
        parse_router(text)
