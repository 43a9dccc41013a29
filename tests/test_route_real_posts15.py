"""route() on the failure classes read from real_test36 after it was scored (issue 24, twenty-seventh round).

- "GPU 0 uses more memory than the other GPUs" written in Chinese ("第0卡显存", "负载不均衡",
  "多显卡") was routed to tensor operations or profiling: "Words users use" had no row for the
  first GPU or for imbalance, and "多显卡" was missing from the multi-GPU row. The distributed skill
  had the routing phrases but no answer: its DDP reference now explains the causes.
- Asking how to go on after an interrupted run in Chinese ("训练中断", "继续运行") was asked about.
- "Could we share the weight parameters of your trained model?" was routed to weight tying, and
  "could you give the ... dataset" to checkpointing (the dataset's name was "SEED"): both are
  requests for a project's files.
- "Weights do not match the architecture" (a title alone) was asked about.
- Chinese words for a loss that explodes or an accuracy that does not change ("暴增",
  "没有变化"; read from real_test35) had no row.

The queries are written here in the style of those posts, not copied from them.
"""

from __future__ import annotations

import pytest

from tests.route_support import assert_project_question, assert_reference_answers, first_skill
from torch_skills.skillpack.route import Router

DISTRIBUTED = "distributed-training-strategies"


@pytest.mark.parametrize(
    "query",
    [
        "多显卡训练时第0卡显存比其他卡多出很多，负载不均衡，别的卡显存用不满",
        "With 4 GPUs, GPU 0 uses much more memory than the other three and runs out of memory first. Why?",
    ],
)
def test_the_first_gpu_holding_more_memory_than_the_others_is_a_distributed_question(
    router: Router, query: str
):
    assert first_skill(router, query) == DISTRIBUTED


def test_the_distributed_skill_explains_why_gpu_0_holds_more_memory():
    skill_md = assert_reference_answers(
        DISTRIBUTED,
        "ddp.md",
        "## GPU 0 uses more memory than the other GPUs",
        "torch.cuda.set_device(local_rank)  # before any other CUDA call",
        "map_location=device",
        "`nn.DataParallel`",
    )
    assert "GPU 0 uses more memory than the other GPUs" in skill_md


def test_going_on_after_an_interrupted_run_asked_in_chinese_is_a_checkpointing_question(router: Router):
    assert (
        first_skill(router, "训练中断了，怎么从最近保存的checkpoint继续运行？")
        == "checkpointing-and-reproducibility"
    )


@pytest.mark.parametrize(
    "query",
    [
        "Hello, could we share the weight parameters of your trained model?",
        "Could you give the ModelNet dataset you used? thanks!",
        "Could you send the SEED dataset you used, like the x_train.npy files?",
    ],
)
def test_asking_for_a_projects_weights_or_data_gets_the_project_question(router: Router, query: str):
    assert_project_question(router, query)


def test_sharing_weights_between_two_parts_of_a_model_is_still_weight_tying(router: Router):
    query = "Can we share weights between the encoder embedding and the output projection?"
    assert first_skill(router, query) == "module-design-patterns"


def test_weights_that_do_not_match_the_architecture_are_a_checkpointing_question(router: Router):
    assert first_skill(router, "Checkpoint weights do not match the model architecture") == (
        "checkpointing-and-reproducibility"
    )


@pytest.mark.parametrize(
    "query",
    ["训练到第10个epoch后loss不断暴增，是什么原因？", "训练了50个epoch，准确率一直没有变化，loss也不动"],
)
def test_a_loss_that_explodes_or_an_accuracy_that_never_changes_in_chinese_is_debugging(
    router: Router, query: str
):
    assert first_skill(router, query) == "debugging-techniques"
