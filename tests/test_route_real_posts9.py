"""route() on the decline classes the fourteenth real-post collection missed (issue 24), one test a class.

The queries are written here in the style of the posts (GitHub issues), not copied from them; the
real posts themselves are scored in evals/routing/real_test14.yaml. Each class is a sign that the
post comes from another framework or from an install that does not link, shown only by the code,
the log or an error's name.
"""

from __future__ import annotations

import pytest

from torch_skills.skillpack.route import Router


@pytest.mark.parametrize(
    "query",
    [
        "Embedding error after changing the vocabulary\n```\nInvalidArgumentError: indices[2,7] = 30011 is not "
        "in [0, 30000)\n```\nI changed the tokenizer and now training stops at the first batch.",
        "Restore fails\nNotFoundError: Key encoder/dense_3/bias not found in checkpoint. I did not change the "
        "network, only the number of classes.",
        "Second step hangs\nThe first `sess.run(train_op)` works, the second never returns. GPU is a 3090.",
        "Weights do not load into the new head\nI call `model.load_weights(path, by_name=True)` and the new "
        "layers stay random, but the loss explodes after two epochs.",
        "Loss stays flat\nI clip with `tf.clip_by_global_norm` and use a learning rate of 1e-3, the loss does "
        "not move after the first epoch.",
    ],
)
def test_tensorflow_shown_by_its_error_classes_session_calls_and_api_is_declined(router: Router, query: str):
    """TensorFlow's own error classes (InvalidArgumentError, NotFoundError ...), `sess.run`, `tf.` calls
    and Keras's `load_weights` name the framework without the word TensorFlow."""
    result = router.route(query)
    assert result.status == "out_of_scope", result.summary
    assert result.out_of_scope == "TensorFlow or Keras"


def test_a_port_from_tensorflow_to_pytorch_is_still_routed(router: Router):
    """The TensorFlow row declines unless PyTorch is named: rewriting `tf.gather_nd` in torch is ours."""
    result = router.route("How do I write tf.gather_nd in PyTorch? torch.gather gives me the wrong shape")
    assert result.status == "routed", result.summary


@pytest.mark.parametrize(
    "query",
    [
        "ImportError when running the sampler\n```\nImportError: /env/lib/python3.10/site-packages/ext/_C.so: "
        "undefined symbol: _ZN3c104cuda9SetDeviceEi\n```",
        "import fails\nImportError: libcudnn.so.8: cannot open shared object file: No such file or directory",
    ],
)
def test_an_extension_that_does_not_link_is_an_install_problem_with_the_rebuild_advice(
    router: Router, query: str
):
    result = router.route(query)
    assert result.status == "out_of_scope", result.summary
    assert result.out_of_scope == "Installing drivers or the CUDA toolkit"
    assert "rebuild" in result.reason


def test_lua_torchs_nngraph_is_another_framework(router: Router):
    result = router.route(
        "Copy weights between two graphs\nI have two nngraph models that differ by a few Identity layers. "
        "How do I copy the weights of the first into the second?"
    )
    assert result.status == "out_of_scope", result.summary


@pytest.mark.parametrize(
    "query",
    [
        "Weights link not working\nThank you for the great work! The link for the pretrained weights in the "
        "README now opens the paper's page instead of the file. Could you update it?",
        "Checkpoints for the ablations\nCould you share the pretrained weights of the ablation models in Table 3?",
        "预训练权重\n您好，预训练模型的链接失效了，可以重新分享一下吗？The links are not available anymore.",
    ],
)
def test_a_request_for_a_projects_weights_or_links_is_asked_about_even_when_it_names_weights(
    router: Router, query: str
):
    """ "the pretrained weights" is the project's file, not a problem of the user's: without a symptom
    the post gets the project-request question, not checkpointing."""
    result = router.route(query)
    assert result.status == "clarify", result.summary
    assert "project" in result.clarify


def test_a_symptom_after_downloading_the_weights_is_routed(router: Router):
    result = router.route(
        "Loss is NaN with your pretrained weights\nI downloaded the checkpoint from the link in the README, "
        "loaded it with load_state_dict and the loss is NaN from the first step."
    )
    assert result.status == "routed", result.summary
