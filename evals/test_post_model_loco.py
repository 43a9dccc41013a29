"""Collections held out: the post models against the rules and phrase scores they were added to.

The real-post collections (evals/routing/real*.yaml) are dealt into EVAL_FOLDS groups; each group
is held out in turn, a model is fitted on the rest and asked about the held-out posts: the skill
model for their first skill, the gate whether to ask. Issue 24: the final answer must never be
worse than the phrase scores on real posts. Slow (sixteen fits; needs torch). For one collection
held out at a time: `python -m evals.post_model_training --loco`.
"""

from __future__ import annotations

from collections import Counter

import pytest

from evals.post_model_training import (
    EVAL_FOLDS,
    gate_leave_one_collection_out,
    leave_one_collection_out,
    load_all_posts,
    load_posts,
)
from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR, SkillPack
from torch_skills.skillpack.route import Router

pytestmark = pytest.mark.slow


def test_the_post_model_beats_the_phrase_scores_on_collections_it_did_not_learn_from():
    router = Router.from_pack(SkillPack.load(DEFAULT_SKILLS_DIR))
    figures = leave_one_collection_out(router, load_posts(router), folds=EVAL_FOLDS)
    for held, f in figures.items():
        print(
            f"{held}: post model {f.model_right}/{f.posts}, phrase-score argmax {f.argmax_right}/{f.posts}"
            f" (only the model {f.only_model}, only the argmax {f.only_argmax})"
        )
    posts = sum(f.posts for f in figures.values())
    model = sum(f.model_right for f in figures.values())
    argmax = sum(f.argmax_right for f in figures.values())
    assert model > argmax, f"post model {model}/{posts} vs phrase-score argmax {argmax}/{posts}"
    worse = [held for held, f in figures.items() if f.clearly_worse()]
    assert not worse, f"collections where the model is clearly worse than the phrase scores: {worse}"


def test_the_gate_asks_fewer_routable_posts_than_the_rules_and_routes_almost_no_vague_ones():
    """Each real collection held out in turn, the gate trained on the rest (and the machine-written
    sets): where the rules would ask, it may route. It must ask about fewer routable posts than the
    rules alone, and route at most one in a hundred of the vague posts the rules ask about (over
    seventeen collections it routed 64 routable posts the rules asked about, and 2 of 334 vague
    ones)."""
    router = Router.from_pack(SkillPack.load(DEFAULT_SKILLS_DIR))
    said = Counter()
    for counts in gate_leave_one_collection_out(load_all_posts(router), folds=EVAL_FOLDS).values():
        said.update(counts)

    def count(want: str, pick: int, got: str) -> int:
        return sum(n for key, n in said.items() if key[0] == want and key[pick] == got)

    rules_asked, gate_asked = count("routed", 1, "clarify"), count("routed", 2, "clarify")
    rules_vague, gate_vague = count("clarify", 1, "clarify"), count("clarify", 2, "clarify")
    print(f"routable posts asked: rules {rules_asked}, with the gate {gate_asked}")
    print(f"vague posts asked: rules {rules_vague}, with the gate {gate_vague}")
    assert gate_asked < rules_asked
    assert rules_vague - gate_vague <= rules_vague / 100
