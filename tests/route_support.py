"""What the route tests check of one answer. Use `first_skill(router, query)` where a post must be
routed (it fails, with the summary, when the post is asked about or declined), and
`assert_status(router, query, status)` where only the status matters (it fails with the whole
answer shown)."""

from __future__ import annotations

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
