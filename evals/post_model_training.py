"""Train `route`'s post model from the labelled real posts; write it, or measure it leave-one-out.

Use after adding or relabelling real posts in evals/routing/real*.yaml, or after editing the
router skill's phrases (the phrase scores are inputs):

    python -m evals.post_model_training            # retrain, write tools/torch_skills/skillpack/post_model.json
    python -m evals.post_model_training --loco     # leave-one-collection-out figures, writes nothing

Needs torch (the fit is L-BFGS on a small design matrix, about ten seconds on two cores). The
model is multinomial logistic regression: inputs are the post's terms that occur in at least
MIN_TERM_POSTS training posts (0/1 each) and the eight phrase scores as SCORE_SCALE * score /
top score; L2 weight WEIGHT_DECAY on the weights, none on the biases. Only routable posts train
it (its job is the first skill of a post that `route` routes). WEIGHT_DECAY was picked from three
values by leave-one-collection-out on the first eight collections before the ninth was opened;
MIN_TERM_POSTS and SCORE_SCALE were set before any measurement (evals/routing/README.md, twelfth
round). How a post becomes terms and scores is the router's own code (`post_features`), so
training and serving read a post the same way.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR, SkillPack
from torch_skills.skillpack.post_model import MODEL_FILE, PostModel
from torch_skills.skillpack.route import Router
from torch_skills.skillpack.text import normalize, terms

ROUTING = Path(__file__).with_name("routing")
MODEL_PATH = Path(__file__).parents[1] / "tools" / "torch_skills" / "skillpack" / MODEL_FILE
MIN_TERM_POSTS = 2
SCORE_SCALE = 3.0
WEIGHT_DECAY = 3e-3
NOT_ROUTED = ("clarify", "decline")


@dataclass(frozen=True)
class Post:
    collection: str  # the yaml file's stem
    label: str
    terms: frozenset[str]
    scores: dict[str, float]


def real_post_files() -> list[Path]:
    return sorted(ROUTING.glob("real*.yaml"))


def inputs_digest(posts: list[Post]) -> str:
    """sha256 over every training post's collection, label, terms and phrase scores: what the model
    learned from. It changes when a post is added or relabelled and when a router edit changes how
    a post reads (its terms or scores), and then the model must be retrained."""
    h = hashlib.sha256()
    for p in posts:
        scores = ",".join(f"{s}={p.scores[s]:.3f}" for s in sorted(p.scores))
        h.update(f"{p.collection}\0{p.label}\0{' '.join(sorted(p.terms))}\0{scores}\0".encode())
    return h.hexdigest()


def post_features(router: Router, query: str) -> tuple[frozenset[str], dict[str, float]]:
    """The model's inputs for a post, exactly as `route` builds them."""
    return frozenset(terms(normalize(query), router.synonyms)), router.route(query).scores


def load_posts(router: Router) -> list[Post]:
    posts = []
    for path in real_post_files():
        for item in yaml.safe_load(path.read_text()):
            if item["expect"] in NOT_ROUTED:
                continue
            post_terms, scores = post_features(router, item["query"])
            posts.append(Post(path.stem, item["expect"], post_terms, scores))
    return posts


def fit(posts: list[Post], skills: list[str]) -> dict:
    """The model as post_model.json holds it, fitted on `posts`."""
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)  # the same weights on every machine
    df = Counter(t for p in posts for t in p.terms)
    vocab = sorted(t for t, c in df.items() if c >= MIN_TERM_POSTS)
    index = {t: i for i, t in enumerate(vocab)}
    x = torch.zeros(len(posts), len(vocab) + len(skills), dtype=torch.float64)
    for row, post in enumerate(posts):
        for t in post.terms:
            if t in index:
                x[row, index[t]] = 1.0
        top = max(post.scores.values()) or 1.0
        for j, skill in enumerate(skills):
            x[row, len(vocab) + j] = SCORE_SCALE * post.scores[skill] / top
    y = torch.tensor([skills.index(p.label) for p in posts])
    weights = torch.zeros(x.shape[1], len(skills), dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(len(skills), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [weights, bias],
        max_iter=500,
        line_search_fn="strong_wolfe",
        tolerance_grad=1e-9,
        tolerance_change=1e-12,
    )

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ weights + bias, y) + WEIGHT_DECAY * (weights**2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    w = weights.detach()
    return {
        "skills": skills,
        "bias": [round(v, 5) for v in bias.detach().tolist()],
        "score_weights": [[round(v, 5) for v in w[len(vocab) + j].tolist()] for j in range(len(skills))],
        "terms": {t: [round(v, 5) for v in w[index[t]].tolist()] for t in vocab},
        "score_scale": SCORE_SCALE,
        "trained_on": len(posts),
    }


def first_skill(model: PostModel, post: Post) -> str:
    return model.rank(post.terms, post.scores)[0][0]


def leave_one_collection_out(router: Router, posts: list[Post]) -> dict[str, tuple[int, int, int]]:
    """Per collection: (posts, right by a model trained on the other collections, right by the
    phrase-score argmax). The router's phrases were tuned on every collection, so the second
    figure still leans on this collection through the scores; the fresh-collection figures do not."""
    skills = sorted(router.table.routes)
    out = {}
    for held in sorted({p.collection for p in posts}):
        model = PostModel.from_json(fit([p for p in posts if p.collection != held], skills))
        test = [p for p in posts if p.collection == held]
        right = sum(first_skill(model, p) == p.label for p in test)
        argmax = sum(max(p.scores, key=lambda s: (p.scores[s], s)) == p.label for p in test)
        out[held] = (len(test), right, argmax)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loco", action="store_true", help="print leave-one-collection-out figures only")
    args = parser.parse_args(argv)
    router = Router.from_pack(SkillPack.load(DEFAULT_SKILLS_DIR))
    posts = load_posts(router)
    if args.loco:
        total = [0, 0, 0]
        for held, (n, right, argmax) in leave_one_collection_out(router, posts).items():
            print(f"{held}: model {right}/{n}, phrase-score argmax {argmax}/{n}")
            total = [a + b for a, b in zip(total, (n, right, argmax), strict=True)]
        print(f"all: model {total[1]}/{total[0]}, phrase-score argmax {total[2]}/{total[0]}")
        return 0
    model = fit(posts, sorted(router.table.routes))
    model["inputs_digest"] = inputs_digest(posts)
    MODEL_PATH.write_text(json.dumps(model, sort_keys=True) + "\n")
    print(f"wrote {MODEL_PATH} ({len(posts)} posts, {len(model['terms'])} terms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
