"""Two linear models learned from labelled posts: the gate (route, ask or decline) and the first skill.

Use `PostModel.load(GATE_FILE).rank(features, scores, gate_inputs(scores, chars, rules_status))`
-> [("routed" | "clarify" | "out_of_scope", probability), ...] and
`PostModel.load().rank(features, scores)` -> [(skill, probability), ...], best first, where
`features = post_features(post_terms, title_terms, text)` (the stemmed terms of the whole post and
of its first line, `text.terms(normalized_text, synonyms)`, and the post's runs of four characters;
`Router.features` builds them) and `scores`
the router's eight phrase scores. `route` asks the gate first; for a post the gate routes, the
first skill of the skill model's ranking is where the post goes.

Both are multinomial logistic regression over the same kinds of input: one weight per label for
each feature found in at least two training posts (a term, valued 1 + ln of how often the post
uses it, a term of the title, valued 1, and a run of four characters, found in at least five,
valued 1: `post_features`), one per
phrase score, scaled as `score_scale * score / top score`, and, for the gate, four named inputs
(`gate_inputs`): the top phrase score, the post's length and what the router's hand-written
decline and clarify rules said. Their weights are package data (`post_model.json.gz`,
`gate_model.json.gz`), written by `python -m evals.post_model_training`: the skill model from the
routable real posts of `evals/routing/real*.yaml`, the gate from every real post and the
machine-written sets there (chat-style requests such as "fix my training" are rare in GitHub
issues). Each file records how many posts it learned from and a digest of what it read in them,
and `tests/test_post_model.py` fails when the posts or the router's phrases change and the files
were not retrained. Nothing here imports torch: scoring is a few dictionary look-ups per term.

Known limitations: they learned from a few thousand posts (`trained_on`; GitHub issues and forum
threads, mostly English, plus the machine-written sets for the gate), so a symptom written in
words those posts never used is weighed by the phrase scores and the rules alone, and on short
questions that name a feature more often than the symptom ("fp16, autocast, GradScaler ... NaN")
the skill model leans to the feature's skill. Figures on the posts they learned from are not a
measurement: `evals/routing/README.md` gives leave-one-collection-out and fresh-collection figures.
"""

from __future__ import annotations

import gzip
import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

# Package data, gzip-compressed JSON (`shipped_json`, `model_file_bytes`): at thirty-five collections
# 0.56 MB instead of 1.91 MB for the two, which keeps a plugin install (a copy of the whole
# checkout) under its size limit.
MODEL_FILE = "post_model.json.gz"
GATE_FILE = "gate_model.json.gz"
GATE_LABELS = ("routed", "clarify", "out_of_scope")  # the statuses a RouteResult can have
TITLE = "title:"  # the prefix of a title term's feature: "title:checkpoint"
CHARS = "chars:"  # the prefix of a character run's feature: "chars:nan "
CHAR_GRAM = 4  # characters per run


def post_features(post_terms: list[str], title_terms: list[str], text: str = "") -> dict[str, float]:
    """What the models read of a post's words: each term valued 1 + ln(times used), each term of its
    first line (an issue's title says what it is about) once more, as TITLE + term, valued 1, and
    each run of CHAR_GRAM characters of `text` (the post as `Router.read` returns it: `char_grams`).
    (Sixteenth round, leave-one-collection-out over thirteen collections: the skill model was right
    on 1,636 of 1,928 routable posts with the counted terms and titles against 1,617 with terms
    present or absent.)"""
    counts = Counter(post_terms)
    features = {term: 1.0 + math.log(n) for term, n in counts.items()}
    features.update({TITLE + term: 1.0 for term in title_terms})
    features.update(char_grams(text))
    return features


def char_grams(text: str) -> dict[str, float]:
    """Each run of CHAR_GRAM characters of the lower-cased text (white space folded to one space),
    as CHARS + run, valued 1: what the term lists cannot read, a post in Chinese or Korean, a
    misspelt word, part of a code name ("多卡训练" -> "chars:多卡训练"). (Seventeenth round,
    leave-one-collection-out over seventeen collections: the skill model was right on 2,146 of
    2,521 routable posts with them against 2,133 without. Counted like terms, 1 + ln(times used),
    they gave 2,168, but a long pasted log's repeated lines then outweighed its error line.)"""
    folded = " ".join(text.lower().split())
    return {CHARS + folded[i : i + CHAR_GRAM]: 1.0 for i in range(len(folded) - CHAR_GRAM + 1)}


# A post the rules would ask about is routed when the gate model finds it routable with at least
# this probability. Seventeenth round, leave-one-collection-out over seventeen collections, with the
# character runs: at 3/4 it routed 80 routable posts the rules ask about, 2 of their 334 vague ones
# and 11 off-topic ones; at 2/3 (the value since the fourteenth round) 97, 5 and 15, over the one
# vague post in a hundred that evals/test_post_model_loco.py allows. Twenty-seventh round, held out
# in eight groups over thirty-seven collections, where 3/4 routed 10 of the 914 vague posts the rules
# ask about (over the limit of 9): at 0.76 it routes 251 of 510 routable posts, 8 vague and 17
# off-topic ones; at 0.78, 239, 7 and 16; at 0.8, 227, 5 and 15. 0.78 keeps a post of margin.
GATE_ROUTES = 0.78


def gate_routes_asked_post(
    gate: PostModel, features: Mapping[str, float], scores: dict[str, float], chars: int
) -> bool:
    """Whether the gate routes a post the hand-written rules would ask about: the one decision it
    makes, for `route` and for the training script's measurements alike."""
    ranking = gate.rank(features, scores, gate_inputs(scores, chars, "clarify"))
    return dict(ranking)["routed"] >= GATE_ROUTES


def gate_inputs(scores: dict[str, float], chars: int, rules_status: str) -> dict[str, float]:
    """The gate's named inputs besides the terms and the scaled phrase scores: how much evidence
    the post has at best, how long it is, and the hand-written rules' verdict (a status)."""
    return {
        "top_score": math.log1p(max(scores.values(), default=0.0)),
        "length": math.log1p(chars) / 3,
        "rules_clarify": float(rules_status == "clarify"),
        "rules_out_of_scope": float(rules_status == "out_of_scope"),
    }


@dataclass(frozen=True)
class PostModel:
    labels: tuple[str, ...]  # what it ranks: skills, or the gate's statuses
    bias: tuple[float, ...]
    score_weights: dict[str, tuple[float, ...]]  # phrase score of skill -> one weight per label
    term_weights: dict[str, tuple[float, ...]]  # feature (post_features) -> one weight per label
    input_weights: dict[str, tuple[float, ...]]  # named input (gate_inputs) -> one weight per label
    score_scale: float
    trained_on: int
    inputs_digest: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PostModel:
        labels = tuple(data["labels"])
        scale = float(data.get("weight_scale", 1))  # weights may be stored as integers in 1 / scale

        def weights(table: dict[str, list[float]]) -> dict[str, tuple[float, ...]]:
            return {name: tuple(w / scale for w in row) for name, row in table.items()}

        return cls(
            labels=labels,
            bias=tuple(data["bias"]),
            score_weights=weights(data["score_weights"]),
            term_weights=weights(data["terms"]),
            input_weights=weights(data.get("inputs", {})),
            score_scale=float(data["score_scale"]),
            trained_on=int(data["trained_on"]),
            inputs_digest=str(data.get("inputs_digest", "")),
        )

    @classmethod
    def load(cls, file: str = MODEL_FILE) -> PostModel:
        """A model shipped with the package (each file read once per process)."""
        return _shipped(file)

    def rank(
        self,
        features: Mapping[str, float],
        scores: dict[str, float],
        inputs: dict[str, float] | None = None,
    ) -> list[tuple[str, float]]:
        """Every label with its probability, best first (ties in label-name order)."""
        logits = list(self.bias)

        def add(weights: tuple[float, ...], value: float) -> None:
            for i, w in enumerate(weights):
                logits[i] += value * w

        for feature, value in features.items():
            if feature in self.term_weights:
                add(self.term_weights[feature], value)
        top = max(scores.values(), default=0.0) or 1.0
        for skill, weights in self.score_weights.items():
            add(weights, self.score_scale * scores.get(skill, 0.0) / top)
        for name, weights in self.input_weights.items():
            add(weights, (inputs or {}).get(name, 0.0))
        peak = max(logits)
        exp = [math.exp(z - peak) for z in logits]
        total = sum(exp)
        probs = {label: e / total for label, e in zip(self.labels, exp, strict=True)}
        return sorted(probs.items(), key=lambda kv: (-kv[1], kv[0]))


def shipped_json(file: str) -> dict[str, Any]:
    """`shipped_json(MODEL_FILE)` -> the model file's JSON object, decompressed."""
    packed = resources.files("torch_skills.skillpack").joinpath(file).read_bytes()
    return json.loads(gzip.decompress(packed).decode("utf-8"))


def model_file_bytes(model: Mapping[str, Any]) -> bytes:
    """What `python -m evals.post_model_training` writes for a model: its JSON (sorted keys, no spaces)
    gzip-compressed with no timestamp, so that the same weights give the same bytes."""
    text = json.dumps(model, sort_keys=True, separators=(",", ":")) + "\n"
    return gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0)


@cache
def _shipped(file: str) -> PostModel:
    return PostModel.from_json(shipped_json(file))
