"""route() on the failure classes of real users' posts left after two rounds (issue 24), one test a class.

The queries are written here in the style of the posts (GitHub issues and forum threads), not
copied from them; the real posts themselves are scored in evals/routing/real_dev*.yaml.
"""

from __future__ import annotations

import pytest

from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR, SkillPack
from torch_skills.skillpack.route import Router


@pytest.fixture(scope="module")
def router() -> Router:
    return Router.from_pack(SkillPack.load(DEFAULT_SKILLS_DIR))


def _first(router: Router, query: str) -> str:
    result = router.route(query)
    return {"clarify": "clarify", "out_of_scope": "decline"}.get(result.status) or result.skills[0]


@pytest.mark.parametrize(
    ("query", "skill"),
    [
        ("训练resnet18，loss一直不下降，学习率是0.01", "debugging-techniques"),
        ("微调7B模型的时候显存不足，batch size已经是1了", "tensor-operations-and-memory"),
        ("用torchrun多机训练的时候卡住了，没有任何输出", "distributed-training-strategies"),
    ],
)
def test_a_chinese_post_is_read_by_its_symptom_phrase(router: Router, query: str, skill: str):
    """A Chinese symptom phrase ("loss 不下降", "显存不足") is read as the English one, also when a
    Latin word is glued to it."""
    assert _first(router, query) == skill


def test_a_latin_word_glued_to_a_cjk_run_keeps_its_word_boundary(router: Router):
    """Keras code right after a Chinese word is still seen: the script boundary is a word boundary."""
    assert _first(router, "用了model.compile(optimizer='adam')之后报错了，怎么办？") == "decline"
