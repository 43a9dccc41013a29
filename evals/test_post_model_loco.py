"""Leave-one-collection-out: the post model against the phrase scores it was added on top of.

Each real-post collection (evals/routing/real*.yaml) is held out in turn, the model is fitted on
the others and asked for the held-out posts' first skill. Issue 24: the final answer must never be
worse than the phrase scores on real posts. Slow (eleven fits, about twenty seconds; needs torch).
"""

from __future__ import annotations

import pytest

from evals.post_model_training import leave_one_collection_out, load_posts
from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR, SkillPack
from torch_skills.skillpack.route import Router

pytestmark = pytest.mark.slow


def test_the_post_model_beats_the_phrase_scores_on_collections_it_did_not_learn_from():
    router = Router.from_pack(SkillPack.load(DEFAULT_SKILLS_DIR))
    figures = leave_one_collection_out(router, load_posts(router))
    for held, (n, right, argmax) in figures.items():
        print(f"{held}: post model {right}/{n}, phrase-score argmax {argmax}/{n}")
    posts = sum(n for n, _, _ in figures.values())
    model = sum(right for _, right, _ in figures.values())
    argmax = sum(a for _, _, a in figures.values())
    assert model > argmax, f"post model {model}/{posts} vs phrase-score argmax {argmax}/{posts}"
    worse = [held for held, (n, right, a) in figures.items() if right < a - max(2, n // 20)]
    assert not worse, f"collections where the model is clearly worse than the phrase scores: {worse}"
