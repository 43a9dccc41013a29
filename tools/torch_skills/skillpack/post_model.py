"""Rank the skills for a post with a linear model learned from labelled real users' posts.

Use `PostModel.load().rank(post_terms, scores)` -> [(skill, probability), ...], best first, where
`post_terms` are the post's stemmed terms (`text.terms(normalized_post, synonyms)`) and `scores`
the router's eight phrase scores. `route` calls it for a post it routes (not one it declines or
asks about): the first skill of the ranking is where the post goes.

The model is multinomial logistic regression over two kinds of input: one weight per skill for
each term that occurs in at least two training posts (present or absent, not counted), and one
weight per skill pair for each phrase score, scaled as `score_scale * score / top score`. Its
weights are package data (`post_model.json`), written by `python -m evals.post_model_training`
from the routable posts of `evals/routing/real*.yaml`; the file records how many posts it learned
from and a digest of what it read in them (labels, terms, phrase scores), and
`tests/test_post_model.py` fails when the posts or the router's phrases change and the file was
not retrained. Nothing here imports torch: scoring is a few dictionary look-ups per term.

Known limitations: it learned from 1,560 routable posts (`trained_on`; GitHub issues and forum
threads, mostly English), so a symptom written in words those posts never used is ranked by the
phrase scores alone, and on short questions that name a feature more often than the symptom
("fp16, autocast, GradScaler ... NaN") it leans to the feature's skill. Its figures on the posts
it learned from are not a measurement: `evals/routing/README.md` gives the leave-one-collection-out
and fresh-collection figures.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

MODEL_FILE = "post_model.json"


@dataclass(frozen=True)
class PostModel:
    skills: tuple[str, ...]
    bias: tuple[float, ...]
    score_weights: dict[str, tuple[float, ...]]  # phrase score of skill -> one weight per output skill
    term_weights: dict[str, tuple[float, ...]]  # term -> one weight per output skill
    score_scale: float
    trained_on: int
    inputs_digest: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PostModel:
        skills = tuple(data["skills"])
        return cls(
            skills=skills,
            bias=tuple(data["bias"]),
            score_weights={s: tuple(w) for s, w in zip(skills, data["score_weights"], strict=True)},
            term_weights={t: tuple(w) for t, w in data["terms"].items()},
            score_scale=float(data["score_scale"]),
            trained_on=int(data["trained_on"]),
            inputs_digest=str(data.get("inputs_digest", "")),
        )

    @classmethod
    def load(cls) -> PostModel:
        """The model shipped with the package (read once per process)."""
        return _shipped()

    def rank(self, post_terms: list[str] | set[str], scores: dict[str, float]) -> list[tuple[str, float]]:
        """Every skill with its probability, best first (ties in skill-name order)."""
        logits = list(self.bias)
        for term in set(post_terms):
            weights = self.term_weights.get(term)
            if weights is not None:
                logits = [z + w for z, w in zip(logits, weights, strict=True)]
        top = max(scores.values(), default=0.0) or 1.0
        for skill, weights in self.score_weights.items():
            value = self.score_scale * scores.get(skill, 0.0) / top
            if value:
                logits = [z + value * w for z, w in zip(logits, weights, strict=True)]
        peak = max(logits)
        exp = [math.exp(z - peak) for z in logits]
        total = sum(exp)
        probs = {s: e / total for s, e in zip(self.skills, exp, strict=True)}
        return sorted(probs.items(), key=lambda kv: (-kv[1], kv[0]))


@cache
def _shipped() -> PostModel:
    text = resources.files("torch_skills.skillpack").joinpath(MODEL_FILE).read_text(encoding="utf-8")
    return PostModel.from_json(json.loads(text))
