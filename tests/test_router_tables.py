"""The router's SKILL.md parses into the tables route() reads."""

from __future__ import annotations

import pytest

from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR, ROUTER_NAME, SkillPack
from torch_skills.skillpack.router import RouterFormatError, load_router_table, parse_router

TOOLS = {"check_distributed", "check_gradients", "estimate_memory", "profile_model", "verify_checkpoint"}


@pytest.fixture(scope="module")
def table():
    return load_router_table(DEFAULT_SKILLS_DIR / ROUTER_NAME)


MINIMAL = """## Start here

| The user reports | Skill | Run first |
|---|---|---|
| slow steps | `a-skill` | `profile_model` |

"""


def test_every_specialist_has_a_route_section_with_phrases_of_every_kind(table):
    """Each of the eight route sections lists symptoms, error messages, example queries and keywords."""
    assert len(table.routes) == 8
    for name, section in table.routes.items():
        for kind in ("symptoms", "errors", "examples", "keywords"):
            assert section.phrases[kind], f"{name} lists no {kind}"


def test_the_tools_the_router_names_are_the_servers_diagnostic_tools(table):
    """The "Run first" cells name only the diagnostic tools, each of them at least once."""
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


def test_a_router_without_a_start_here_table_is_a_format_error():
    """The parser says what is missing instead of routing on nothing."""
    with pytest.raises(RouterFormatError, match="Start here"):
        parse_router("# Router\n\nSome prose.\n")


def test_a_precedence_row_with_missing_cells_names_its_line():
    """A malformed table row is reported with its line number."""
    text = MINIMAL + "## Precedence\n\n| a | b | c | d |\n|---|---|---|---|\n| nan | amp |\n"
    with pytest.raises(RouterFormatError, match="line 11"):
        parse_router(text)


def test_the_skill_md_body_alone_gives_each_specialist_its_tools():
    """The start table is in SKILL.md, so a reader of the body alone (the prompts) gets every tool."""
    body = SkillPack.load(DEFAULT_SKILLS_DIR).get(ROUTER_NAME).body
    alone = parse_router(body)
    assert len(alone.routes) == 8
    assert alone.routes["performance-profiling"].tools == ["profile_model"]
    assert alone.routes["module-design-patterns"].tools == []
    assert not any(phrase for r in alone.routes.values() for phrase in r.all_phrases())


def test_the_term_lists_live_in_the_reference_and_not_in_the_skill_body():
    """The tool's word lists (routes, synonyms, vague phrasings, decline signs) stay out of SKILL.md
    so they do not bury the tables a reader needs."""
    body = SkillPack.load(DEFAULT_SKILLS_DIR).get(ROUTER_NAME).body
    for section in ("## Routes", "## Words users use", "## Ask one question first", "## Out of scope"):
        assert section not in body
    assert body.index("## Start here") < body.index("## Precedence") < body.index("## When to decline")
    assert "references/routing-terms.md" in body


def test_out_of_scope_and_not_evidence_tables_are_read(table):
    """What to decline, what names PyTorch, which pasted lines to ignore and the help words come from the file."""
    topics = {t.topic: t for t in table.out_of_scope}
    assert "tensorflow" in topics["TensorFlow or Keras"].signs
    assert topics["TensorFlow or Keras"].declines == "unless"
    assert any(t.declines == "always" for t in table.out_of_scope)
    assert all(t.say for t in table.out_of_scope)
    assert "torch" in table.pytorch_signs
    assert "pytorch version:" in table.not_evidence
    assert "advice" in table.help_words
    assert "lr" in table.setup_words
    assert "review my" in table.review_words
    assert "setup" in table.topic_words


def test_an_out_of_scope_row_without_a_declines_value_names_its_line():
    """The Declines cell must say unless / outweighs / always / on sight."""
    text = (
        MINIMAL
        + "## Out of scope\n\n| Topic | Signs | Declines | Say |\n|---|---|---|---|\n| JAX | jax | sometimes | no |\n"
    )
    with pytest.raises(RouterFormatError, match="line 11"):
        parse_router(text)


def test_a_route_section_for_a_skill_missing_from_the_start_table_is_an_error():
    """Every skill the term lists name has a row a reader can see."""
    ref = "## Routes\n\n### other-skill\n\n**Symptoms**\n- x\n"
    with pytest.raises(RouterFormatError, match="references/t.md line 3"):
        parse_router(MINIMAL, {"references/t.md": ref})
