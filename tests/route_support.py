"""What the route tests check of one answer. Use `first_skill(router, query)` where a post must be
routed (it fails, with the summary, when the post is asked about or declined), and
`assert_status(router, query, status)` where only the status matters (it fails with the whole
answer shown), `assert_project_question(router, query)` where a request for a project's files must
get the project question. `assert_reference_answers(skill, reference, *passages)` checks that the skill a
post goes to has the answer: a reference holding each passage, linked from its SKILL.md."""

from __future__ import annotations

from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR
from torch_skills.skillpack.route import Router


def first_skill(router: Router, query: str) -> str:
    """The first skill of a post that must be routed."""
    result = router.route(query)
    assert result.status == "routed", result.summary
    return result.skills[0]


def assert_status(router: Router, query: str, expected: str) -> None:
    """Assert the post's status ("routed", "clarify" or "out_of_scope")."""
    result = router.route(query)
    assert result.status == expected, (result.status, result.skills, result.summary)


def assert_project_question(router: Router, query: str) -> None:
    """Assert that a request for a project's weights, code or data is asked the project question."""
    result = router.route(query)
    assert result.status == "clarify", (result.status, result.skills)
    assert result.clarify.startswith("What do you want to do with the project")


def assert_reference_answers(skill: str, reference: str, *passages: str) -> str:
    """Assert that skills/<skill>/references/<reference> holds every passage and that the skill's
    SKILL.md links to it; return the SKILL.md text for further checks."""
    folder = DEFAULT_SKILLS_DIR / skill
    text = (folder / "references" / reference).read_text()
    for passage in passages:
        assert passage in text, (reference, passage)
    skill_md = (folder / "SKILL.md").read_text()
    assert f"references/{reference}" in skill_md
    return skill_md
