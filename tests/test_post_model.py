"""The post model that sets a routed post's first skill (tools/torch_skills/skillpack/post_model.py)."""

from __future__ import annotations

import math

import pytest

from evals.post_model_training import (
    HeldOut,
    Post,
    collection_folds,
    gate_training_posts,
    inputs_digest,
    load_all_posts,
    skill_posts,
    skill_training_posts,
)
from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR, SkillPack
from torch_skills.skillpack.post_model import (
    CHARS,
    GATE_FILE,
    GATE_LABELS,
    MODEL_FILE,
    TITLE,
    PostModel,
    char_grams,
    model_file_bytes,
    post_features,
    shipped_json,
)
from torch_skills.skillpack.route import Router, RouterFormatError


@pytest.fixture(scope="module")
def all_posts(router: Router) -> list[Post]:
    return load_all_posts(router)


def test_the_shipped_skill_model_was_trained_on_the_current_posts_and_phrases(all_posts: list[Post]):
    """Adding or relabelling a real post, or editing the router skill so that a post reads with other
    terms or scores, needs `python -m evals.post_model_training` before the change lands."""
    posts = skill_training_posts(all_posts)
    model = PostModel.load()
    assert model.trained_on == len(posts), "retrain: python -m evals.post_model_training"
    assert model.inputs_digest == inputs_digest(posts), "retrain: python -m evals.post_model_training"


def test_the_skill_model_learns_only_from_real_routable_posts_whose_labellers_agree(all_posts: list[Post]):
    """A post the second labeller put on another skill (or asked or declined) is scored, not learned
    from; a post with one labelling is learned from."""
    scored, learned = skill_posts(all_posts), skill_training_posts(all_posts)
    split = [p for p in scored if p.second_label is not None and p.second_label != p.label]
    assert split and not set(map(id, split)) & set(map(id, learned))
    assert len(learned) == len(scored) - len(split)
    assert any(p.second_label is None for p in learned)
    assert all(p.real and p.routable for p in learned)


def test_the_gate_learns_from_every_post_but_those_whose_labellers_disagree_on_its_status(
    all_posts: list[Post],
):
    learned = gate_training_posts(all_posts)
    split = [p for p in all_posts if p.second_label in ("clarify", "decline") and p.routable]
    assert split and not set(map(id, split)) & set(map(id, learned))
    assert any(p.routable and p.second_label not in (None, p.label) for p in learned)  # another skill
    assert any(not p.real for p in learned)


def test_the_shipped_gate_was_trained_on_the_labelled_posts_as_the_rules_read_them_now(all_posts: list[Post]):
    """The gate learns from every set in evals/routing, and the hand-written rules' verdict is one of
    its inputs: a new post, a relabelling or a rule edit that changes a verdict needs retraining."""
    posts = gate_training_posts(all_posts)
    model = PostModel.load(GATE_FILE)
    assert model.trained_on == len(posts), "retrain: python -m evals.post_model_training"
    assert model.inputs_digest == inputs_digest(posts, gate=True), (
        "retrain: python -m evals.post_model_training"
    )


@pytest.mark.parametrize(("file", "labels"), [(MODEL_FILE, None), (GATE_FILE, list(GATE_LABELS))])
def test_both_models_ship_as_package_data_and_know_the_routers_skills(router: Router, file: str, labels):
    data = shipped_json(file)
    assert data["labels"] == (labels or sorted(router.table.routes))
    assert sorted(data["score_weights"]) == sorted(router.table.routes)
    assert all(len(w) == len(data["labels"]) for w in data["terms"].values())


def test_a_routed_post_starts_with_the_models_first_skill_and_reports_its_probability(router: Router):
    query = "after loading the checkpoint the optimizer state is on the wrong device and resume crashes"
    result = router.route(query)
    (first, probability), *_ = router.post_model.rank(router.features(router.read(query)), result.scores)
    assert result.status == "routed"
    assert result.skills[0] == first and result.confidence == round(probability, 2)


def test_the_ranking_is_every_skill_with_probabilities_that_sum_to_one(router: Router):
    scores = dict.fromkeys(router.table.routes, 0.0) | {"debugging-techniques": 4.0}
    ranking = router.post_model.rank(post_features(["nan", "loss"], []), scores)
    assert sorted(s for s, _ in ranking) == sorted(router.table.routes)
    assert math.isclose(sum(p for _, p in ranking), 1.0)
    assert [p for _, p in ranking] == sorted((p for _, p in ranking), reverse=True)


def test_words_the_model_never_saw_leave_the_phrase_scores_to_decide(router: Router):
    """With no known term, only the biases and the scaled phrase scores count: a post whose only
    evidence is one skill's phrases goes to that skill."""
    for skill in router.table.routes:
        scores = dict.fromkeys(router.table.routes, 0.0) | {skill: 5.0}
        assert router.post_model.rank(post_features(["zzqx"], ["zzqx"]), scores)[0][0] == skill, skill


def test_a_term_used_again_counts_more_but_less_than_twice():
    features = post_features(["nan", "loss", "nan", "nan"], [])
    assert features["loss"] == 1.0
    assert features["nan"] == pytest.approx(1.0 + math.log(3))


def test_the_title_terms_are_features_of_their_own_next_to_the_same_terms_in_the_body():
    assert post_features(["nan", "loss", "amp"], ["nan", "loss"]) == {
        "nan": 1.0,
        "loss": 1.0,
        "amp": 1.0,
        TITLE + "nan": 1.0,
        TITLE + "loss": 1.0,
    }


def test_a_post_in_chinese_reaches_the_models_through_its_character_runs(router: Router):
    """The term lists drop CJK characters that no "Words users use" phrase covers; the runs of four
    characters still carry them to the models."""
    features = router.features(router.read("多卡训练速度慢"))
    assert {CHARS + "多卡训练", CHARS + "卡训练速", CHARS + "训练速度", CHARS + "练速度慢"} <= set(features)


def test_character_runs_fold_case_and_white_space_and_count_once():
    runs = char_grams("NaN\n\n  nan nan")
    assert runs == {CHARS + "nan ": 1.0, CHARS + "an n": 1.0, CHARS + "n na": 1.0, CHARS + " nan": 1.0}
    assert char_grams("abc") == {}


def test_the_models_learned_weights_for_character_runs_seen_in_several_posts():
    data = shipped_json(MODEL_FILE)
    runs = [t for t in data["terms"] if t.startswith(CHARS)]
    assert runs and all(len(t) == len(CHARS) + 4 for t in runs)


def test_the_router_reads_the_first_line_with_words_as_the_title(router: Router):
    features = router.features(router.read("\n\n  \nLoss is NaN with AMP\nbody text about the optimizer"))
    titled = {f.removeprefix(TITLE) for f in features if f.startswith(TITLE)}
    assert titled and titled <= set(features)
    assert not any(f.startswith(TITLE) and "optim" in f for f in features)


def test_a_model_for_other_skills_is_refused_with_the_step_that_fixes_it(monkeypatch: pytest.MonkeyPatch):
    shipped = PostModel.load()
    skills = [*shipped.labels[:-1], "a-skill-that-was-renamed"]
    renamed = PostModel.from_json(
        {
            "labels": skills,
            "bias": list(shipped.bias),
            "score_weights": {
                s: list(w) for s, w in zip(skills, shipped.score_weights.values(), strict=True)
            },
            "terms": {},
            "score_scale": shipped.score_scale,
            "trained_on": 0,
        }
    )
    monkeypatch.setattr(PostModel, "load", classmethod(lambda cls, file=MODEL_FILE: renamed))
    with pytest.raises(RouterFormatError, match="python -m evals.post_model_training"):
        Router.from_pack(SkillPack.load(DEFAULT_SKILLS_DIR))


def _gate_sure_of(router: Router, status: str) -> PostModel:
    """A stand-in gate that always says `status`."""
    return PostModel.from_json(
        {
            "labels": list(GATE_LABELS),
            "bias": [9.0 if label == status else 0.0 for label in GATE_LABELS],
            "score_weights": {s: [0.0] * len(GATE_LABELS) for s in router.table.routes},
            "terms": {},
            "score_scale": 3.0,
            "trained_on": 0,
        }
    )


def test_the_gate_may_overrule_an_ask_and_nothing_else():
    """The gate is consulted only where the rules would ask first: there it may route the post. A
    decline (another framework's code) and a routed post stay what the rules made them."""
    router = Router.from_pack(SkillPack.load(DEFAULT_SKILLS_DIR))
    keras = "model = Sequential()\nmodel.add(Dense(10))\nmodel.compile(loss='mse')\nloss is nan after epoch 1"
    nan = "loss becomes NaN after a few hundred steps and the gradients explode"
    vague = "Any tips for training this model? Thanks"
    assert [router.route(q, gate=False).status for q in (keras, nan, vague)] == [
        "out_of_scope",
        "routed",
        "clarify",
    ]
    router.gate_model = _gate_sure_of(router, "routed")
    assert [router.route(q).status for q in (keras, nan, vague)] == ["out_of_scope", "routed", "routed"]
    for status in ("clarify", "out_of_scope"):
        router.gate_model = _gate_sure_of(router, status)
        assert [router.route(q).status for q in (keras, nan, vague)] == ["out_of_scope", "routed", "clarify"]


def test_held_out_groups_cover_every_collection_once_and_stay_few_as_collections_are_added():
    names = {f"real_test{i}" for i in range(30)}
    groups = collection_folds(names, 8)
    assert len(groups) == 8
    assert sorted(n for g in groups for n in g) == sorted(names)
    assert max(map(len, groups)) - min(map(len, groups)) <= 1
    assert collection_folds({"real_dev", "real_test"}, 8) == [{"real_dev"}, {"real_test"}]
    assert [len(g) for g in collection_folds(names, None)] == [1] * 30


def test_a_collection_counts_as_clearly_worse_only_when_the_split_posts_lean_beyond_chance():
    assert not HeldOut(69, 59, 63, 4, 8).clearly_worse()  # 8 against 4 of 12 split posts: chance
    assert HeldOut(150, 100, 118, 2, 20).clearly_worse()  # 20 against 2 of 22
    assert not HeldOut(150, 120, 100, 25, 5).clearly_worse()  # the model better
    assert not HeldOut(10, 10, 10, 0, 0).clearly_worse()


def test_a_model_file_is_the_same_bytes_for_the_same_weights_and_reads_back_whole():
    model = {"labels": ["a", "b"], "bias": [1, -1], "terms": {"x": [5, -5]}}
    assert model_file_bytes(model) == model_file_bytes(dict(reversed(model.items())))
    shipped = shipped_json(GATE_FILE)
    assert shipped["labels"] == list(GATE_LABELS) and shipped["trained_on"] > 0
