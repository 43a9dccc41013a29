"""route() on the failure classes of real users' posts left after eighteen rounds (issue 24).

Lua Torch7 logs, TensorFlow 1 session code, Caffe logs, Caffe2 `workspace` calls, Keras' `Unknown
layer` and input-shape checks and TensorRT's tools were routed as PyTorch questions, and license
questions were asked to clarify; "how do I count the FLOPs and parameters of the model?" and
"resume starts from scratch" (in Chinese) were asked to clarify; "could you provide the weights of
your trained model?" was routed to checkpointing. The queries are written here in the style of those
posts, not copied from them; the real posts themselves are scored in evals/routing/real_test*.yaml.
"""

from __future__ import annotations

import pytest

from torch_skills.skillpack.route import Router

LUA_TORCH7_LOG = """module 'cutorch' not found

I get this error when I run the demo

> luajit: demo.lua:5: module 'cutorch' not found:
\tno field package.preload['cutorch']
\tno file '/home/user/torch/install/share/lua/5.1/cutorch.lua'
\tno file './cutorch.so'"""


@pytest.mark.parametrize(
    "query",
    [
        LUA_TORCH7_LOG,
        "error running the example\n\nqlua: run_mnist.lua:2: module 'cudnn' not found:\n"
        "\tno file '/home/me/torch/install/lib/lua/5.1/cudnn.so'",
        "代码有问题\n\n1：占位符没有定义\n2：训练时 sess.run 没有传 feed_dict",
        "The input placeholder is never fed: feed_dict={} is passed after the batch",
        "No LuaRocks module found for 'dpnn' after I pulled the repository again",
        "out of memory at test time\n\nF0517 09:12:44.118273  2231 syncedmem.cpp:56] Check failed: "
        "error == cudaSuccess (2 vs. 0)  out of memory",
        "ValueError: Unknown layer: AttentionPooling\n\nTraining was fine, the error comes when I load the saved model.",
    ],
)
def test_another_frameworks_traceback_or_session_code_is_declined_as_another_framework(
    router: Router, query: str
):
    """A Lua traceback line (`file.lua:5:`, luajit, qlua, LuaRocks) is Torch7, even with `torch` in its
    paths; `sess.run(` and `feed_dict` are TensorFlow 1; a glog `Check failed` line is Caffe's; `Unknown
    layer:` is Keras loading a model. The post is declined as another
    framework's, not as an install problem and not routed on the words around the code."""
    result = router.route(query)
    assert result.status == "out_of_scope", result.summary
    assert "another framework" in (result.reason or ""), result.reason


@pytest.mark.parametrize(
    "query",
    [
        "How to calculate the FLOPs and params of your model?",
        "How can I count the flops and parameters of this network? Looking forward to your reply.",
    ],
)
def test_a_question_how_to_count_flops_is_routed_to_profiling(router: Router, query: str):
    """Counting a model's FLOPs and parameters is a measurement question, not a vague one."""
    result = router.route(query)
    assert result.status == "routed", result.summary
    assert result.skills[0] == "performance-profiling", result.summary


def test_pip_saying_no_matching_distribution_is_declined(router: Router):
    result = router.route(
        'pip says "no matching distribution" for torch 2.0.0+cu118, which version do I need?'
    )
    assert result.status == "out_of_scope", result.summary


def test_resume_that_starts_from_scratch_in_chinese_is_routed_to_checkpointing(router: Router):
    result = router.route("断点续训问题\n\n加了resume参数以后，训练还是从头开始训练，请问怎么解决？")
    assert result.status == "routed", result.summary
    assert result.skills[0] == "checkpointing-and-reproducibility", result.summary


@pytest.mark.parametrize(
    "query",
    [
        "checkpoint available?\n\nCould you please provide the weights of your trained model? Thanks!",
        "Trained checkpoints\n\nWould it be possible to share trained weights? We are comparing several models.",
    ],
)
def test_asking_the_authors_for_their_trained_weights_gets_the_project_question(router: Router, query: str):
    """Asking for a project's weights names no problem of the asker's: the post gets the clarifying
    question, not a checkpointing answer."""
    result = router.route(query)
    assert result.status == "clarify", result.summary


@pytest.mark.parametrize(
    "query",
    [
        "Error creating layer conv3_2\n\nTraining stops right away.\n\n"
        "I0912 10:02:11.514871 20411 net.cpp:150] Setting up data\n"
        "I0912 10:02:11.514902 20411 net.cpp:157] Top shape: 8 3 224 224 (1204224)",
        "The program returns at workspace.RunNet(train_model.net.Proto().name) without any error, why?",
        "ValueError: Input 0 of layer sequential_1 is incompatible with the layer: expected ndim=3, found ndim=2",
        "ValueError: Error when checking input: expected dense_input to have 2 dimensions, but got array with shape (32, 4, 4)",
        "trtexec fails to build the engine for my detector",
        "No importer registered for op: GridSample when I parse the exported model",
    ],
)
def test_caffe_logs_caffe2_calls_keras_shape_checks_and_tensorrt_tools_are_declined(
    router: Router, query: str
):
    """A glog line from a C++ framework, Caffe2's `workspace` calls, Keras' input checks and TensorRT's
    tools are other frameworks' signs: the post is declined."""
    result = router.route(query)
    assert result.status == "out_of_scope", result.summary


def test_a_question_about_the_license_is_declined(router: Router):
    result = router.route("Model license\n\nCan the released model be used in commercial software?")
    assert result.status == "out_of_scope", result.summary
