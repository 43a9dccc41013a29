"""route() on three failure classes of real users' posts left after eighteen rounds (issue 24).

Lua Torch7 logs and TensorFlow 1 session code were routed as PyTorch questions (their only signs
were a Lua traceback line or `sess.run(..., feed_dict=...)`), and "how do I count the FLOPs and
parameters of the model?" was asked to clarify. The queries are written here in the style of those
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
    ],
)
def test_another_frameworks_traceback_or_session_code_is_declined_as_another_framework(
    router: Router, query: str
):
    """A Lua traceback line (`file.lua:5:`, luajit, qlua) is Torch7, even with `torch` in its paths;
    `sess.run(` and `feed_dict` are TensorFlow 1. The post is declined as another
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
