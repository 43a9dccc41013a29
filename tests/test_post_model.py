"""The post model that sets a routed post's first skill (tools/torch_skills/skillpack/post_model.py)."""

from __future__ import annotations

import json
import math
from importlib import resources

import pytest

from evals.post_model_training import inputs_digest, load_posts
from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR, SkillPack
from torch_skills.skillpack.post_model import MODEL_FILE, PostModel
from torch_skills.skillpack.route import Router, RouterFormatError
from torch_skills.skillpack.text import normalize, terms


def test_the_shipped_model_was_trained_on_the_current_posts_and_phrases(router: Router):
    """Adding or relabelling a real post, or editing the router skill so that a post reads with other
    terms or scores, needs `python -m evals.post_model_training` before the change lands."""
    posts = load_posts(router)
    model = PostModel.load()
    assert model.trained_on == len(posts), "retrain: python -m evals.post_model_training"
    assert model.inputs_digest == inputs_digest(posts), "retrain: python -m evals.post_model_training"


def test_the_model_ships_as_package_data_and_knows_the_routers_skills(router: Router):
    data = json.loads(resources.files("torch_skills.skillpack").joinpath(MODEL_FILE).read_text())
    assert sorted(data["skills"]) == sorted(router.table.routes)
    assert all(len(w) == len(data["skills"]) for w in data["terms"].values())


def test_a_routed_post_starts_with_the_models_first_skill_and_reports_its_probability(router: Router):
    query = "after loading the checkpoint the optimizer state is on the wrong device and resume crashes"
    result = router.route(query)
    (first, probability), *_ = router.post_model.rank(terms(normalize(query), router.synonyms), result.scores)
    assert result.status == "routed"
    assert result.skills[0] == first and result.confidence == round(probability, 2)


def test_the_ranking_is_every_skill_with_probabilities_that_sum_to_one(router: Router):
    scores = dict.fromkeys(router.table.routes, 0.0) | {"debugging-techniques": 4.0}
    ranking = router.post_model.rank(["nan", "loss"], scores)
    assert sorted(s for s, _ in ranking) == sorted(router.table.routes)
    assert math.isclose(sum(p for _, p in ranking), 1.0)
    assert [p for _, p in ranking] == sorted((p for _, p in ranking), reverse=True)


def test_words_the_model_never_saw_leave_the_phrase_scores_to_decide(router: Router):
    """With no known term, only the biases and the scaled phrase scores count: a post whose only
    evidence is one skill's phrases goes to that skill."""
    for skill in router.table.routes:
        scores = dict.fromkeys(router.table.routes, 0.0) | {skill: 5.0}
        assert router.post_model.rank(["zzqx"], scores)[0][0] == skill, skill


def test_a_model_for_other_skills_is_refused_with_the_step_that_fixes_it(monkeypatch: pytest.MonkeyPatch):
    shipped = PostModel.load()
    renamed = PostModel.from_json(
        {
            "skills": [*shipped.skills[:-1], "a-skill-that-was-renamed"],
            "bias": list(shipped.bias),
            "score_weights": [list(w) for w in shipped.score_weights.values()],
            "terms": {},
            "score_scale": shipped.score_scale,
            "trained_on": 0,
        }
    )
    monkeypatch.setattr(PostModel, "load", classmethod(lambda cls: renamed))
    with pytest.raises(RouterFormatError, match="python -m evals.post_model_training"):
        Router.from_pack(SkillPack.load(DEFAULT_SKILLS_DIR))
