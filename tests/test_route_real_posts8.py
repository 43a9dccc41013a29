"""route() on failure classes of the eleventh and twelfth real-post collections (issue 24), one test a class.

The queries are written here in the style of the posts (GitHub issues), not copied from them; the
real posts themselves are scored in evals/routing/real_test11.yaml and real_test12.yaml.
"""

from __future__ import annotations

import pytest

from torch_skills.skillpack.route import Router


@pytest.mark.parametrize(
    "query",
    [
        "Pretrained weights\nThe Baidu link needs an account I cannot make. Could you upload the model to Google Drive?",
        "Checkpoint link expired\nThe download link in the README is dead. Could you re-upload the weights?",
        "Dataset link is broken\nThe download link for the dataset returns 404, is there a mirror?",
        "Code release?\nGreat paper! When will the code be released?",
    ],
)
def test_a_request_for_a_projects_files_gets_the_question_not_a_decline(router: Router, query: str):
    """Asking a project's authors for its weights, data or code names no problem of the user's: like
    "can you share your checkpoint?" it gets the clarifying question (what do you want to do with
    the project?), not a decline and not a route on "weights"."""
    result = router.route(query)
    assert result.status == "clarify", result.summary


def test_the_word_explain_in_a_question_about_a_symptom_does_not_decline_it_as_theory(router: Router):
    """ "Explain" is how people ask about anything; a post about step time growing is profiling."""
    result = router.route(
        "Step time grows with every iteration\nCan anyone explain this? Each step is slower than the last."
    )
    assert result.status == "routed" and result.skills[0] == "performance-profiling", result.summary


@pytest.mark.parametrize(
    "query",
    [
        "what's the hook for?\nCould you tell me what the hook in this file is used for?",
        "activations\nCan I change the activation from relu to prelu here?",
    ],
)
def test_a_short_question_about_model_parts_is_not_declined_as_not_machine_learning(
    router: Router, query: str
):
    """Hooks, activations and optimizer names are machine-learning words: a post that uses them is
    not a question about something else."""
    assert router.route(query).status != "out_of_scope"
