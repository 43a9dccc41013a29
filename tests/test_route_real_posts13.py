"""route() on questions about how autograd records the graph (issue 24, twenty-second round).

Real users' posts about a graph that was cut or built on a copy ("can't optimize a non-leaf
Tensor", "element 0 of tensors does not require grad", where a `detach()` belongs, `detach()`
against `no_grad()`) are labelled custom-autograd-functions by both labellers, but the pack had
nothing to answer them with: the custom-autograd skill covered hand-written Functions only. It now
has references/graph-mechanics.md, and the router's table sends these questions there. Before,
"where should the detach go?" was asked about or went to optimizers, and "detach the teacher's
output for distillation" was declined as "not machine learning". The queries are written here in
the style of those posts, not copied from them.
"""

from __future__ import annotations

import pytest

from tests.route_support import assert_reference_answers, assert_status, first_skill
from torch_skills.skillpack.route import Router

GRAPH_QUESTIONS = [
    "Should the target be detached here?\n\nThe TD target comes from the target network; do I need detach() "
    "on it, or does the optimizer only update the online network anyway?",
    "What is the difference between detach() and torch.no_grad()?",
    "Should I detach the hidden state between batches of my RNN?",
    "Do I need to call detach on the teacher output for distillation?",
    "ValueError: can't optimize a non-leaf Tensor\n\nI call .cuda() on my embedding after setting "
    "requires_grad=True and the optimizer constructor fails.",
]


@pytest.mark.parametrize("query", GRAPH_QUESTIONS)
def test_a_question_about_a_cut_or_copied_graph_goes_to_custom_autograd(router: Router, query: str):
    assert first_skill(router, query) == "custom-autograd-functions"


def test_the_skill_it_goes_to_answers_the_graph_errors():
    """The pack's answer exists: the skill links a reference that names both errors."""
    assert_reference_answers(
        "custom-autograd-functions",
        "graph-mechanics.md",
        "can't optimize a non-leaf Tensor",
        "element 0 of tensors does not require grad",
    )


@pytest.mark.parametrize(
    "query",
    [
        "When is the code going to be open sourced?",
        "Can't wait for the open-source release of the training scripts!",
        "Any plan to fully open source the project?\n\nWould love to open source it in our lab too.",
    ],
)
def test_asking_when_the_code_is_open_sourced_gets_the_project_question(router: Router, query: str):
    """A request for the authors' code names no problem of the user's: it was declined or routed."""
    assert_status(router, query, "clarify")


def test_an_open_sourced_project_with_a_symptom_is_still_routed(router: Router):
    assert_status(
        router,
        "Since you open sourced the code: the loss turns NaN after 3k steps in bf16, any idea?",
        "routed",
    )


@pytest.mark.parametrize(
    "query",
    [
        "ResourceExhausted: OOM when allocating tensor with shape[32,512,28,28] and type float\n\nHow to fix?",
        "Restoring from checkpoint failed. This is most likely due to a Variable name or other graph key "
        "that is missing from the checkpoint.",
    ],
)
def test_tensorflows_own_oom_and_restore_messages_decline_on_sight(router: Router, query: str):
    assert_status(router, query, "out_of_scope")


@pytest.mark.parametrize(
    "query",
    [
        "RuntimeError: grad can be implicitly created only for scalar outputs\n\nI get it with my own loss.",
        "RuntimeError: One of the differentiated Tensors appears to not have been used in the graph. "
        "Set allow_unused=True if this is the desired behavior.",
        "RuntimeError: you can only change requires_grad flags of leaf variables.",
    ],
)
def test_errors_of_backward_and_autograd_grad_themselves_go_to_the_graph_reference(
    router: Router, query: str
):
    assert first_skill(router, query) == "custom-autograd-functions"
