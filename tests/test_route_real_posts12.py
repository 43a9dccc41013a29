"""route() on failure classes of real users' posts left after nineteen rounds (issue 24).

A short question about one thing, named by a single keyword ("How do I resume an interrupted run?",
"where do I set the seed?", "how did you measure the latency?"), was asked to clarify: one keyword
was read as a bare topic even where a question asks about it. A request for the project's files
("do you have the checkpoints of the ablation models?") still gets the clarifying question, and so
does "will the weights be released?" in any word order. Another framework's version written run-on
("TensorFlow2.4.1"), a traceback through an installed MXNet or Paddle package, `stop_gradient`,
Keras' `CuDNNLSTM` and "Input 0 is incompatible with layer ...", TensorFlow's `CollectiveAllReduce`,
"Tensor flow" in two words and Taichi were routed or asked about. Chinese "loss 不降低" and "共享权重",
"the gradient remains at 0" and "breakpoint training" (resuming) were asked about, and generated
images that come out solid black were declined as "not machine learning". The queries are written
here in the style of those posts, not copied from them; the real posts themselves are scored in
evals/routing/real_test*.yaml.
"""

from __future__ import annotations

import pytest

from tests.route_support import assert_status, first_skill
from torch_skills.skillpack.route import Router


@pytest.mark.parametrize(
    ("query", "skill"),
    [
        (
            "Resume an interrupted run?\n\nHow can I resume from an interrupted run?",
            "checkpointing-and-reproducibility",
        ),
        ("请问如果想让结果可以复现，应该在哪里设置seed？", "checkpointing-and-reproducibility"),
        ("Latency\n\nHi, how do you measure the latency of the model in your code?", "performance-profiling"),
        ("How do you test the fps of the model?", "performance-profiling"),
        ("Can training be resumed from a breakpoint?", "checkpointing-and-reproducibility"),
    ],
)
def test_a_question_about_one_named_thing_is_routed_to_its_skill(router: Router, query: str, skill: str):
    assert first_skill(router, query) == skill


@pytest.mark.parametrize(
    "query",
    [
        "Checkpoints of the ablation?\n\nDo you have checkpoints for the models of the ablation study?",
        "Pretrained model\n\nCould you upload the pretrained model?",
    ],
)
def test_a_question_for_the_projects_files_still_gets_the_clarifying_question(router: Router, query: str):
    assert_status(router, query, "clarify")


@pytest.mark.parametrize(
    "query",
    [
        "Are the pretrained weights going to be released?",
        "The checkpoints are still unreleased after a year, when can we get them?",
    ],
)
def test_asking_when_the_weights_are_released_gets_the_clarifying_question(router: Router, query: str):
    assert_status(router, query, "clarify")


@pytest.mark.parametrize(
    "query",
    [
        "NaN loss\n\nI run it with TensorFlow2.6.0 and the loss is nan after the first epoch",
        "error in the data loader\n\nTraceback (most recent call last):\n"
        '  File "/opt/conda/lib/python3.8/site-packages/mxnet/gluon/data/dataloader.py", line 120, in __iter__\n'
        "    batch = next(it)\nValueError: the batch is empty",
        "MXNetError: [10:21:03] src/ndarray/ndarray.cc:1279: shape mismatch in the loss",
        "Why do you call stop_gradient on the target branch? Is the gradient not needed there?",
        "Training is slow with my LSTM, should I switch to CuDNNLSTM to get faster epochs?",
        "Training on two GPUs fails: AttributeError: 'CollectiveAllReduce' object has no attribute '_pool'",
        "How can I speed up training? I am new to taichi and the fitting takes an hour on a T4.",
    ],
)
def test_another_frameworks_name_version_traceback_or_api_is_declined(router: Router, query: str):
    assert_status(router, query, "out_of_scope")


@pytest.mark.parametrize(
    ("query", "skill"),
    [
        ("loss 一直不降低，一直在 3 左右上下波动，是什么原因？", "debugging-techniques"),
        ("这两个分支之间是共享权重的吗？", "module-design-patterns"),
        ("Is it normal that my gradient remains at 0 for the whole run?", "debugging-techniques"),
    ],
)
def test_a_loss_that_does_not_fall_shared_weights_and_a_gradient_stuck_at_zero_are_routed(
    router: Router, query: str, skill: str
):
    assert first_skill(router, query) == skill


@pytest.mark.parametrize(
    "query",
    [
        "Black images\n\nNo error at all, but every generated image is solid black. What could cause this?",
        "Generated image is completely black\n\nThe script finishes with no error, but the generated image is completely black.",
    ],
)
def test_generated_images_that_come_out_black_are_a_debugging_question(router: Router, query: str):
    assert first_skill(router, query) == "debugging-techniques"


@pytest.mark.parametrize(
    "query",
    [
        "ValueError: Input 0 is incompatible with layer dense_2: expected min_ndim=2, found ndim=1",
        "Tensor flow keeps crashing on my laptop, what should I check?",
    ],
)
def test_keras_shape_checks_and_tensor_flow_in_two_words_are_declined(router: Router, query: str):
    assert_status(router, query, "out_of_scope")


def test_breakpoint_training_reads_as_resuming(router: Router):
    assert first_skill(router, "How can I do breakpoint training?") == "checkpointing-and-reproducibility"
