"""Train `route`'s two post models (the gate and the first skill); write them, or measure them leave-one-out.

Use after adding or relabelling posts in evals/routing/*.yaml, or after editing the router skill's
phrases or rules (the phrase scores and the rules' verdict are inputs):

    python -m evals.post_model_training            # retrain, write post_model.json.gz and gate_model.json.gz
    python -m evals.post_model_training --loco     # leave-one-collection-out figures, writes nothing

Needs torch (each fit is L-BFGS on a small design matrix, ten to twenty seconds on two cores).
Both models are multinomial logistic regression (`tools/torch_skills/skillpack/post_model.py`):
inputs are the post's features (`post_features`: its terms, valued 1 + ln(count), its title's
terms and its runs of four characters) that occur in at least MIN_TERM_POSTS training posts
(MIN_CHAR_POSTS for a character run), the
eight phrase scores as SCORE_SCALE * score / top score and, for the gate, `gate_inputs` (top
score, length, the hand-written rules' verdict); L2 weight SKILL_WEIGHT_DECAY or GATE_WEIGHT_DECAY
on the weights, none on the biases. The skill model learns from the routable real posts (its job
is the first skill of a post that `route` routes); the gate from every real post and every
machine-written set, labelled routed / clarify / out_of_scope. Where a collection was labelled a
second time (evals/second_labels.py), a post the two labellers disagree on is left out of what a
model learns: of the skill model's posts when the skills differ, of the gate's when the statuses
do (twenty-fourth round); every post is still scored. The weight decay was picked from
three values by leave-one-collection-out on the first eight collections before the ninth was
opened, and the skill model's again over nineteen collections before the twentieth was opened
(eighteenth round); a feature whose weights are all under NEGLIGIBLE_WEIGHT is left out of the
file. MIN_TERM_POSTS and SCORE_SCALE were set before any measurement (evals/routing/README.md,
twelfth round); the gate's inputs and training sets were chosen by leave-one-collection-out
before the eleventh collection was opened (fourteenth round). How a post becomes features, scores
and a rules verdict is the router's own code (`read_post`), so training and serving read a post
the same way.
"""

from __future__ import annotations

import argparse
import hashlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import yaml

from evals.second_labels import second_labels
from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR, SkillPack
from torch_skills.skillpack.post_model import (
    CHARS,
    GATE_FILE,
    GATE_LABELS,
    MODEL_FILE,
    PostModel,
    gate_inputs,
    gate_routes_asked_post,
    model_file_bytes,
)
from torch_skills.skillpack.route import Router

ROUTING = Path(__file__).with_name("routing")
PACKAGE = Path(__file__).parents[1] / "tools" / "torch_skills" / "skillpack"
MIN_TERM_POSTS = 2
MIN_CHAR_POSTS = 5  # a character run needs more posts: there are ten times as many
SCORE_SCALE = 3.0
# Eighteenth round, leave-one-collection-out over nineteen collections: the skill model was right on
# 2,439 / 2,437 / 2,428 / 2,419 of 2,826 routable posts at 3e-4 / 1e-3 / 3e-3 / 1e-2. The gate at
# 1e-3 would route 4 of the 387 vague posts the rules ask about, over the slow eval's one in a
# hundred, so it keeps 3e-3.
SKILL_WEIGHT_DECAY = 1e-3
GATE_WEIGHT_DECAY = 3e-3
# weights are written as integers in units of 1 / WEIGHT_SCALE: the files stay small (a plugin install
# copies them). Twenty-fifth round: 10,000 -> 1,000 (a weight's error at most 0.0005) took the two
# files from 2.17 to 1.86 MB and changed 1 of the 10,384 eval posts' answers (2,000: 2 changed).
WEIGHT_SCALE = 1_000
# a feature whose every weight is under this is left out of the file: it moves a logit by less than
# 0.02 where it is found, and the gate has thousands of them (eighteenth round: gate_model.json
# 1.11 -> 0.92 MB, post_model.json 1.16 -> 1.15 MB, and no answer to the 6,973 eval posts changed).
# Twenty-second round, at thirty-one collections: 0.002 -> 0.004 took the two files from 2.56 to 2.22 MB
# (the plugin cache's room for more collections) and changed no answer to the 9,697 eval posts; 0.005
# changed one and 0.0075 six.
NEGLIGIBLE_WEIGHT = 0.004
NOT_ROUTED = {"clarify": "clarify", "decline": "out_of_scope"}  # label -> the status it expects


@dataclass(frozen=True)
class Post:
    collection: str  # the yaml file's stem
    label: str  # a skill, "clarify" or "decline"
    features: dict[str, float]  # post_model.post_features, as Router.features reads the post
    scores: dict[str, float]
    chars: int  # the post's length as `route` reads it
    rules_status: str  # what the hand-written rules alone say
    second_label: str | None = None  # a second, blind labeller's label, where the collection has one

    @property
    def labels_agree(self) -> bool:
        """Whether a second labeller, if any, gave the same label."""
        return self.second_label in (None, self.label)

    @property
    def statuses_agree(self) -> bool:
        """Whether a second labeller, if any, gave a label with the same status (any skill: routed)."""
        return self.second_label is None or NOT_ROUTED.get(self.second_label, "routed") == self.status

    @property
    def real(self) -> bool:
        return self.collection.startswith("real")

    @property
    def routable(self) -> bool:
        return self.label not in NOT_ROUTED

    @property
    def status(self) -> str:
        return NOT_ROUTED.get(self.label, "routed")

    @property
    def inputs(self) -> dict[str, float]:
        return gate_inputs(self.scores, self.chars, self.rules_status)


def inputs_digest(posts: list[Post], gate: bool = False) -> str:
    """sha256 over what a model learned from: every training post's collection, label, features and
    phrase scores (and for the gate its length and the rules' verdict). It changes when a post is
    added or relabelled and when a router edit changes how a post reads; then retrain."""
    h = hashlib.sha256()
    for p in posts:
        scores = ",".join(f"{s}={p.scores[s]:.3f}" for s in sorted(p.scores))
        extra = f"{p.chars}\0{p.rules_status}\0" if gate else ""
        features = " ".join(f"{f}={v:.3f}" for f, v in sorted(p.features.items()))
        h.update(f"{p.collection}\0{p.label}\0{features}\0{scores}\0{extra}".encode())
    return h.hexdigest()


def read_post(
    router: Router, collection: str, label: str, query: str, second_label: str | None = None
) -> Post:
    """A post as the models see it, exactly as `route` builds their inputs."""
    by_rules = router.route(query, gate=False)
    posted = router.read(query)
    return Post(
        collection,
        label,
        router.features(posted),
        by_rules.scores,
        len(posted),
        by_rules.status,
        second_label,
    )


def load_all_posts(router: Router) -> list[Post]:
    """Every labelled post in evals/routing: the real collections and the machine-written sets."""
    second = second_labels()
    return [
        read_post(router, path.stem, item["expect"], item["query"], second.get(f"{path.stem}-{index:03d}"))
        for path in sorted(ROUTING.glob("*.yaml"))
        for index, item in enumerate(yaml.safe_load(path.read_text()))
    ]


def skill_posts(posts: list[Post]) -> list[Post]:
    """The posts the skill model is scored on: the routable real posts (by their first label)."""
    return [p for p in posts if p.real and p.routable]


def skill_training_posts(posts: list[Post]) -> list[Post]:
    """The skill posts it learns from: those whose second labeller, where there is one, agrees.
    A post the two labellers put on different skills teaches a coin toss; held out in eight groups
    over thirty-two collections, leaving the 264 such posts out got 3,036 rather than 3,021 of the
    3,404 posts with two agreeing labels right, and 4,209 rather than 4,210 by the first labels."""
    return [p for p in skill_posts(posts) if p.labels_agree]


def gate_training_posts(posts: list[Post]) -> list[Post]:
    """The posts the gate learns from: all, but those whose second labeller gave another status
    (clarify against a skill, say). Held out in eight groups over thirty-two collections, leaving
    them out asked 211 rather than 220 of 4,843 routable posts and routed 143 rather than 142 of
    922 vague ones."""
    return [p for p in posts if p.statuses_agree]


def load_posts(router: Router) -> list[Post]:
    """The skill model's posts: the routable real posts."""
    return skill_posts(load_all_posts(router))


def fit(
    posts: list[Post],
    labels: list[str],
    label_of: Callable[[Post], str],
    named_inputs: bool,
    weight_decay: float,
) -> dict:
    """A model as the json files hold it, fitted on `posts`."""
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)  # the same weights on every machine
    skills = sorted(posts[0].scores)
    names = sorted(posts[0].inputs) if named_inputs else []
    df = Counter(f for p in posts for f in p.features)
    vocab = sorted(
        t for t, c in df.items() if c >= (MIN_CHAR_POSTS if t.startswith(CHARS) else MIN_TERM_POSTS)
    )
    index = {t: i for i, t in enumerate(vocab)}
    width = len(vocab) + len(skills) + len(names)
    rows: list[int] = []
    cols: list[int] = []
    values: list[float] = []

    def put(row: int, col: int, value: float) -> None:
        rows.append(row)
        cols.append(col)
        values.append(value)

    for row, post in enumerate(posts):
        for feature, value in post.features.items():
            if feature in index:
                put(row, index[feature], value)
        top = max(post.scores.values()) or 1.0
        for j, skill in enumerate(skills):
            put(row, len(vocab) + j, SCORE_SCALE * post.scores[skill] / top)
        inputs = post.inputs
        for j, name in enumerate(names):
            put(row, len(vocab) + len(skills) + j, inputs[name])
    x = torch.sparse_coo_tensor(
        [rows, cols], values, (len(posts), width), dtype=torch.float64, check_invariants=True
    ).coalesce()
    y = torch.tensor([labels.index(label_of(p)) for p in posts])
    weights = torch.zeros(width, len(labels), dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(len(labels), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [weights, bias],
        max_iter=500,
        line_search_fn="strong_wolfe",
        tolerance_grad=1e-9,
        tolerance_change=1e-12,
    )

    def closure():
        opt.zero_grad()
        loss = (
            torch.nn.functional.cross_entropy(torch.sparse.mm(x, weights) + bias, y)
            + weight_decay * (weights**2).sum()
        )
        loss.backward()
        return loss

    opt.step(closure)
    w = weights.detach()

    def row(i: int) -> list[int]:
        return [round(v * WEIGHT_SCALE) for v in w[i].tolist()]

    return {
        "labels": labels,
        "bias": [round(v, 5) for v in bias.detach().tolist()],
        "score_weights": {s: row(len(vocab) + j) for j, s in enumerate(skills)},
        "terms": {t: row(index[t]) for t in vocab if w[index[t]].abs().max() >= NEGLIGIBLE_WEIGHT},
        "inputs": {n: row(len(vocab) + len(skills) + j) for j, n in enumerate(names)},
        "score_scale": SCORE_SCALE,
        "weight_scale": WEIGHT_SCALE,
        "trained_on": len(posts),
    }


def fit_skill_model(posts: list[Post]) -> dict:
    return fit(
        posts, sorted(posts[0].scores), lambda p: p.label, named_inputs=False, weight_decay=SKILL_WEIGHT_DECAY
    )


def fit_gate(posts: list[Post]) -> dict:
    return fit(
        posts, list(GATE_LABELS), lambda p: p.status, named_inputs=True, weight_decay=GATE_WEIGHT_DECAY
    )


def first_skill(model: PostModel, post: Post) -> str:
    return model.rank(post.features, post.scores)[0][0]


def gate_status(model: PostModel, post: Post) -> str:
    """What `route` answers for the post with this gate: the rules' verdict, unless they ask and
    the gate finds the post routable with probability GATE_ROUTES."""
    if post.rules_status != "clarify":
        return post.rules_status
    return "routed" if gate_routes_asked_post(model, post.features, post.scores, post.chars) else "clarify"


# The slow evals hold out the real collections in this many groups rather than one at a time:
# the cost stays at this many fits per model however many collections are added (one per
# collection took fifteen minutes of the slow set at twenty-seven collections). `--loco` still
# holds each collection out on its own.
EVAL_FOLDS = 8


def collection_folds(collections: set[str], folds: int | None) -> list[set[str]]:
    """The real collections, sorted by name and dealt round-robin into `folds` groups (one group per
    collection when `folds` is None or not smaller than their number)."""
    names = sorted(collections)
    count = len(names) if folds is None else min(folds, len(names))
    return [set(names[i::count]) for i in range(count)]


class HeldOut(NamedTuple):
    """One held-out collection: its routable posts, how many the skill model trained without it and
    the phrase-score argmax got right, and how many only one of the two got right."""

    posts: int
    model_right: int
    argmax_right: int
    only_model: int
    only_argmax: int

    def clearly_worse(self) -> bool:
        """Whether the model loses to the argmax by more than chance allows: of the posts only one
        of them got right, the argmax's share exceeds the model's by over two standard deviations
        (a sign test, about 2.5% one-sided when they are equally good)."""
        split = self.only_model + self.only_argmax
        return self.only_argmax - self.only_model > 2 * split**0.5


def leave_one_collection_out(
    router: Router, posts: list[Post], folds: int | None = None
) -> dict[str, HeldOut]:
    """Per real collection: a `HeldOut` for a skill model trained without it against the phrase-score
    argmax. `posts` are the skill model's (`load_posts`). With `folds`, the
    collections are held out that many groups at a time (`collection_folds`). The router's
    phrases were tuned on every collection, so the second figure still leans on this collection
    through the scores; the fresh-collection figures do not."""
    out = {}
    for held in collection_folds({p.collection for p in posts}, folds):
        model = PostModel.from_json(
            fit_skill_model(skill_training_posts([p for p in posts if p.collection not in held]))
        )
        for name in sorted(held):
            test = [p for p in posts if p.collection == name]
            by_model = [first_skill(model, p) == p.label for p in test]
            by_argmax = [max(p.scores, key=lambda s: (p.scores[s], s)) == p.label for p in test]
            out[name] = HeldOut(
                len(test),
                sum(by_model),
                sum(by_argmax),
                sum(m and not a for m, a in zip(by_model, by_argmax, strict=True)),
                sum(a and not m for m, a in zip(by_model, by_argmax, strict=True)),
            )
    return dict(sorted(out.items()))


def gate_leave_one_collection_out(all_posts: list[Post], folds: int | None = None) -> dict[str, Counter]:
    """Per real collection: Counter of (expected status, the rules' status, `route`'s status) for a
    gate trained on every post outside it (the machine-written sets always among them); `folds`
    as in `leave_one_collection_out`."""
    out = {}
    for held in collection_folds({p.collection for p in all_posts if p.real}, folds):
        model = PostModel.from_json(
            fit_gate(gate_training_posts([p for p in all_posts if p.collection not in held]))
        )
        for name in sorted(held):
            out[name] = Counter(
                (p.status, p.rules_status, gate_status(model, p)) for p in all_posts if p.collection == name
            )
    return dict(sorted(out.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loco", action="store_true", help="print leave-one-collection-out figures only")
    args = parser.parse_args(argv)
    router = Router.from_pack(SkillPack.load(DEFAULT_SKILLS_DIR))
    all_posts = load_all_posts(router)
    posts = skill_posts(all_posts)
    if args.loco:
        total = [0, 0, 0]
        for held, (n, right, argmax, _, _) in leave_one_collection_out(router, posts).items():
            print(f"{held}: skill model {right}/{n}, phrase-score argmax {argmax}/{n}")
            total = [a + b for a, b in zip(total, (n, right, argmax), strict=True)]
        print(f"all: skill model {total[1]}/{total[0]}, phrase-score argmax {total[2]}/{total[0]}")
        gates = Counter()
        for counts in gate_leave_one_collection_out(all_posts).values():
            gates.update(counts)
        for who, pick in (("rules alone", 1), ("with the gate", 2)):
            said = Counter()
            for key, n in gates.items():
                said[(key[0], key[pick])] += n
            print(
                f"{who}: "
                + ", ".join(
                    f"{want} -> {got} {said[(want, got)]}" for want in GATE_LABELS for got in GATE_LABELS
                )
            )
        return 0
    skill_training, gate_training = skill_training_posts(all_posts), gate_training_posts(all_posts)
    for file, model, trained in (
        (MODEL_FILE, fit_skill_model(skill_training), skill_training),
        (GATE_FILE, fit_gate(gate_training), gate_training),
    ):
        model["inputs_digest"] = inputs_digest(trained, gate=file == GATE_FILE)
        (PACKAGE / file).write_bytes(model_file_bytes(model))
        print(f"wrote {PACKAGE / file} ({len(trained)} posts, {len(model['terms'])} terms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
