"""route() on the failure classes read in the eleventh routing round (issue 24), one test a class.

The round was tuned on all 1,585 earlier real posts (evals/routing/real_*.yaml) and measured on a
fresh collection (real_test8.yaml). The queries here are written in the style of those posts, not
copied from them.
"""

from __future__ import annotations

import pytest

from torch_skills.skillpack.route import Router


@pytest.mark.parametrize(
    "query",
    [
        "多卡训练的问题：我用两张显卡训练，只有第一张卡在跑，第二张显存没有变化，是哪里设置错了？",
        "单机多卡训练时报错，请问需要怎么设置？",
    ],
)
def test_multi_gpu_said_in_chinese_is_a_distributed_question(router: Router, query: str):
    """多卡 ('several cards') is how Chinese posts say multi-GPU training."""
    assert router.route(query).label == "distributed-training-strategies"


@pytest.mark.parametrize(
    "query",
    [
        "训练中途断了，怎么从保存的checkpoint继续训练？",
        "학습이 중간에 끊겼는데 체크포인트에서 이어서 학습하려면 어떻게 하나요?",
        "我跑了两次训练，结果不一样，怎么固定随机性？",
    ],
)
def test_resuming_and_run_to_run_randomness_said_in_chinese_or_korean_go_to_checkpointing(
    router: Router, query: str
):
    """Resuming (继续训练, 이어서 학습), a checkpoint (체크포인트) and results that differ between runs
    (结果不一样, 随机性) are checkpointing-and-reproducibility questions, not too vague to route."""
    assert router.route(query).label == "checkpointing-and-reproducibility"


def test_a_custom_backward_in_the_picture_is_read_with_the_hunt_for_a_detached_graph(router: Router):
    """A gradient that is None under the user's own custom backward: custom-autograd-functions (its
    gradcheck finds a wrong backward) and the general hunt for a detached graph are the first two
    (the post model puts debugging first; the precedence row it replaced put custom autograd first)."""
    query = (
        "The custom backward of my layer returns None for the bias, so after loss.backward() the "
        "bias grad is None and the bias is never updated."
    )
    result = router.route(query)
    assert set(result.skills[:2]) == {"custom-autograd-functions", "debugging-techniques"}


@pytest.mark.parametrize(
    "query",
    [
        "Training with BF16 gives clearly worse accuracy than FP32 on my dataset. Is that expected?",
        "Why use LARS when the batch size is only 4096? Would plain SGD reach the same accuracy?",
    ],
)
def test_precision_that_costs_accuracy_and_named_optimizers_go_to_mixed_precision(router: Router, query: str):
    """Accuracy lost to a lower precision is a precision question, not the vague 'worse accuracy
    than' that asks what goes wrong; LARS is an optimizer."""
    assert router.route(query).label == "mixed-precision-and-optimization"


def test_a_progress_bar_in_a_pasted_log_is_not_a_slowness_complaint(router: Router):
    """tqdm's rate ('2.61it/s') in a pasted log says how fast it ran, not that it is slow."""
    query = (
        "GPU memory\n"
        "  0%|          | 0/500 [00:00<?, ?it/s]\n"
        " 10%|#         | 50/500 [00:30<04:30, 1.66it/s]\n"
        "then it crashes with out of memory"
    )
    assert router.route(query).label == "tensor-operations-and-memory"


def test_asking_when_weights_will_be_published_is_a_request_to_the_authors(router: Router):
    """'will be published' asks a project's authors for their material: the clarifying question."""
    query = (
        "Pretrained model\nI noticed in the README that the pretrained models will be published soon. I am "
        "also working on a similar model with a large batch and limited GPU memory. Can you tell me when?"
    )
    assert router.route(query).label == "clarify"


def test_a_reproduction_of_a_papers_results_said_in_chinese_asks_what_differs(router: Router):
    """复现结果 ('my reproduced results') is a comparison with a paper's numbers, the clarifying
    question, even when it says the results differ (结果不一样), which alone reads as 'different
    results', not as run-to-run randomness (seen on real_test8 after the eleventh round)."""
    query = "复现结果不一样怎么办\n我的复现结果比论文里的低了5个点，请问是什么原因？"
    assert router.route(query).label == "clarify"


def test_a_post_about_a_papers_findings_is_machine_learning_not_off_topic(router: Router):
    """'the paper' is an ML word here: a request about reproducing a paper's findings gets the
    clarifying question, not the 'not machine learning at all' decline."""
    query = "can not reproduce the findings of the paper\nCould you provide a script for reproducing them?"
    assert router.route(query).label == "clarify"
