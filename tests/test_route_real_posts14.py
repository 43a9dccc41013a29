"""route() on requests for a project's files and on other frameworks' commands (issue 24, twenty-fifth round).

Read from real_test33 after it was scored: asking authors to share, release or re-upload their
weights or checkpoints, or whether these are available, was routed to checkpointing when the
wording was not one of the listed "project request" phrases ("could you share the model weights",
"availability of the pretrained checkpoints"); the "Ask one question first" row now also holds
regular expressions for these requests. Posts that show another framework through an import of
OneFlow, MegEngine or Jittor, a `th script.lua` command or a Julia package (`Flux.jl`), or that
name Caffe's `prototxt`, were routed. The queries are written here in the style of those posts, not
copied from them.

Read from real_test34 after it was scored (twenty-sixth round): "is it possible to release the
checkpoints", "any chance to publish the code", "estimated time to release your checkpoints" are the
same request; and `'collections.OrderedDict' object has no attribute 'eval'` (a state dict loaded
where a model was expected; 7 real posts, all labelled checkpointing) went to module design, while
the checkpointing skill had no answer for it.
"""

from __future__ import annotations

import pytest

from tests.route_support import assert_project_question, assert_reference_answers, assert_status, first_skill
from torch_skills.skillpack.route import Router

REQUESTS_FOR_FILES = [
    "Hi, thanks for the great work! Could you please share the final model weights of the large variant?",
    "Do you plan on releasing the pretrained checkpoints for the ablation models?",
    "Availability of the pretrained weights\n\nHello, I would like to try the model on my own images.",
    "Are the trained checkpoints still available? I would like to compare against them.",
    "Release of the training code\n\nCongrats on the acceptance! Is there a date yet?",
    "Is it possible to release the XL-v2 checkpoints that were used for Table 3?",
    "Any chance to publish the fine-tuning code as well? Thanks!",
]


@pytest.mark.parametrize("query", REQUESTS_FOR_FILES)
def test_a_request_for_a_projects_weights_or_code_gets_the_project_question(router: Router, query: str):
    assert_project_question(router, query)


def test_a_request_with_a_loading_error_is_still_routed(router: Router):
    query = (
        "Could you share the pretrained weights again? I downloaded the old file and load_state_dict raises "
        'RuntimeError: Error(s) in loading state_dict for Net: Missing key(s) in state_dict: "fc.weight"'
    )
    assert first_skill(router, query) == "checkpointing-and-reproducibility"


def test_sharing_weights_between_layers_is_a_module_question_not_a_request(router: Router):
    query = "How can the decoder share the weights of the embedding layer? Do I assign the same Parameter?"
    assert first_skill(router, query) == "module-design-patterns"


def test_thanks_for_releasing_the_code_does_not_make_a_slow_run_a_request(router: Router):
    query = (
        "Thanks for making the code available! Inference takes 2 seconds per image on my 3090, "
        "while the paper reports 30 FPS. How can I speed it up?"
    )
    assert first_skill(router, query) == "performance-profiling"


OTHER_FRAMEWORKS = [
    "The warmup scheduler never reaches the base learning rate (the PyTorch one does)\n\n```python\n"
    "import oneflow as flow\nopt = flow.optim.SGD(params, lr=0.1)\n```",
    "th train.lua -gpuid 0 -batch_size 16\n\nThe PyTorch port trains fine, but this stops after the first "
    "epoch with out of memory.",
    "In PyTorch Geometric this works, but with GraphNeuralNetworks.jl the attention layer ignores the edge "
    "features.",
    "Why does the deploy prototxt use Xavier for the conv layers but Gaussian for the fully connected ones?",
]


@pytest.mark.parametrize("query", OTHER_FRAMEWORKS)
def test_another_frameworks_import_command_or_package_is_declined(router: Router, query: str):
    assert_status(router, query, "out_of_scope")


def test_is_it_possible_to_share_weights_between_layers_stays_a_module_question(router: Router):
    query = "Is it possible to share the same weights between the two encoder branches?"
    assert first_skill(router, query) == "module-design-patterns"


@pytest.mark.parametrize("attribute", ["eval", "parameters", "to"])
def test_a_state_dict_used_as_a_model_goes_to_checkpointing(router: Router, attribute: str):
    query = (
        f"AttributeError: 'collections.OrderedDict' object has no attribute '{attribute}'\n\n"
        "It happens as soon as I run test.py. What should I do?"
    )
    assert first_skill(router, query) == "checkpointing-and-reproducibility"


def test_the_checkpointing_skill_answers_a_state_dict_used_as_a_model():
    skill_md = assert_reference_answers(
        "checkpointing-and-reproducibility",
        "safe-loading-and-formats.md",
        "## A file of weights is not a model",
        "model.load_state_dict(loaded)",
    )
    assert "safe-loading-and-formats.md#a-file-of-weights-is-not-a-model" in skill_md
