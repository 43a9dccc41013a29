"""The second, blind labellings of the real-post sets (evals/routing/labels, read by evals/second_labels.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from evals.second_labels import second_labels

ROUTING = Path(__file__).resolve().parents[1] / "evals" / "routing"


def test_every_set_with_a_second_labelling_has_exactly_one_second_label_per_post():
    labels = second_labels()
    sets = {post_id.rsplit("-", 1)[0] for post_id in labels}
    assert {
        "real_dev",
        "real_test",
        "real_test17",
        "real_test18",
        "real_test19",
        "real_test20",
        "real_test21",
        "real_test22",
        "real_test23",
        "real_test24",
        "real_test25",
        "real_test26",
        "real_test27",
        "real_test28",
        "real_test29",
        "real_test30",
        "real_test31",
        "real_test32",
        "real_test33",
        "real_test34",
        "real_test35",
        "real_test36",
        "real_test37",
    } <= sets
    for name in sets:
        posts = yaml.safe_load((ROUTING / f"{name}.yaml").read_text())
        ids = {post_id for post_id in labels if post_id.rsplit("-", 1)[0] == name}
        assert ids == {f"{name}-{i:03d}" for i in range(len(posts))}, name


def test_second_labels_are_skills_or_clarify_or_decline(router):
    allowed = set(router.table.routes) | {"clarify", "decline"}
    assert set(second_labels().values()) <= allowed
