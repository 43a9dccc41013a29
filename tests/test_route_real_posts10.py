"""route() on two failure classes of real users' posts left after seventeen rounds (issue 24).

Posts in Chinese, Japanese or Korean that name a symptom in everyday words ("显存占用逐渐增加",
"メモリリーク", "속도가 느립니다") were asked to clarify; installs and broken wheels were routed as
PyTorch bugs. The queries are written here in the style of those posts, not copied from them; the
real posts themselves are scored in evals/routing/real_test*.yaml.
"""

from __future__ import annotations

import pytest

from torch_skills.skillpack.route import Router
from torch_skills.skillpack.text import Synonyms, tokens


@pytest.mark.parametrize(
    ("query", "skill"),
    [
        ("训练时显存占用逐渐增加，最后爆掉，是内存泄漏吗？", "tensor-operations-and-memory"),
        ("学習を続けるとメモリリークが起きて、プロセスが落ちます", "tensor-operations-and-memory"),
        ("학습 속도가 너무 느립니다. 데이터 로딩이 병목인가요?", "performance-profiling"),
        ("设置了随机数种子，但每次训练结果都不同", "checkpointing-and-reproducibility"),
        ("验证的时候显存累计增加，最后OOM", "tensor-operations-and-memory"),
        ("为什么推理这么慢？一张图片要十几秒", "performance-profiling"),
        ("训练了两天，loss一直下降不了，是什么原因？", "debugging-techniques"),
        (
            "It takes almost 8 hours for one epoch on a single A100, is that expected?",
            "performance-profiling",
        ),
        (
            "How do I continue the interrupted training from the last saved epoch?",
            "checkpointing-and-reproducibility",
        ),
        (
            "I trained the model on a GPU server; how do I load the checkpoint on a laptop with only a CPU?",
            "checkpointing-and-reproducibility",
        ),
    ],
)
def test_a_post_naming_a_symptom_in_everyday_words_is_routed(router: Router, query: str, skill: str):
    """The "Words users use" rows read a symptom's everyday words in Chinese, Japanese, Korean and
    English ("hours for one epoch", "interrupted training"), so the post is routed instead of being
    asked what it is about."""
    result = router.route(query)
    assert result.status == "routed", result.summary
    assert result.skills[0] == skill, result.summary


@pytest.mark.parametrize(
    "query",
    [
        "ERROR: torch-2.1.0-cp38-cp38-linux_aarch64.whl is not a supported wheel on this platform",
        "OSError: [WinError 126] error loading c10.dll right after a fresh install on Windows",
        "Installation hangs forever at 'Solving environment' when I create the conda env from environment.yml",
    ],
)
def test_an_install_or_a_broken_wheel_is_declined(router: Router, query: str):
    """Installing is outside the pack: the install row's signs (wheel, dll, installation, conda)
    outweigh the few symptom words such a post has."""
    result = router.route(query)
    assert result.status == "out_of_scope", result.summary


@pytest.mark.parametrize(
    ("query", "skill"),
    [
        (
            "After installing torch 2.3 my DDP job hangs at init_process_group with an NCCL timeout",
            "distributed-training-strategies",
        ),
        (
            "I installed the nightly wheel and now the loss becomes NaN after a few hundred steps with fp16 autocast",
            "debugging-techniques",
        ),
    ],
)
def test_a_pytorch_problem_that_mentions_an_install_in_passing_is_still_routed(
    router: Router, query: str, skill: str
):
    result = router.route(query)
    assert result.status == "routed", result.summary
    assert result.skills[0] == skill, result.summary


def test_a_synonym_phrase_matches_its_words_inflected_and_without_articles():
    """A phrase of "Words users use" reads "releasing a pretrained models" as "release the pretrained
    model"; one word matches only as written, so "freeze" (layers) does not read as "freezes" (hangs)."""
    synonyms = Synonyms({"release the pretrained model": "project request", "freezes": "hangs"})
    assert synonyms.apply(tokens("any plan of releasing a pretrained models?")) == [
        "any", "plan", "of", "project", "request",
    ]  # fmt: skip
    assert synonyms.apply(tokens("freeze the backbone")) == ["freeze", "the", "backbone"]
    assert synonyms.apply(tokens("the run freezes")) == ["the", "run", "hangs"]


@pytest.mark.parametrize(
    "query",
    [
        "Could you release a pretrain model? Pretraining on ImageNet is expensive for me.",
        "The current reproduction result is 89.5, I can not get the 91 reported",
    ],
)
def test_a_request_for_a_projects_weights_or_its_reported_numbers_in_other_words_is_asked_about(
    router: Router, query: str
):
    result = router.route(query)
    assert result.status == "clarify", result.summary
