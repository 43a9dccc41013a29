"""How far the real-post labels agree between two labellers, and how the router scores where they agree.

Run from the repository root: `python evals/routing/label_agreement.py`. For every real set with a
second labelling (labels/real_second_labels.yaml: real_dev and real_test; labels/real_second_labels2.yaml:
real_test11 ... real_test17; each post's text alone, no source address, no first labels) it prints, per
kind of label (routable, clarify, decline), how often the second label is the first one, and the
shipped router's answers on all posts and on the posts both labellers agree on (aggregates only: no
post is printed). The router's skill model and gate learned from these sets, so its figures here are
in-sample; each set's first, frozen scoring is in evals/routing/README.md.

Known limitations: the second labellers followed the same written label rules as the first, so the
agreement measures how well the rules pin a post down, not how experts at large would label it.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tools"), str(ROOT)]

from evals.second_labels import second_labels  # noqa: E402
from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR, SkillPack  # noqa: E402
from torch_skills.skillpack.route import Router  # noqa: E402

HERE = Path(__file__).parent
KINDS = ("routable", "clarify", "decline")


def kind_of(label: str) -> str:
    return label if label in ("clarify", "decline") else "routable"


def agreement(router: Router, name: str, second: dict[str, str]) -> Counter:
    counts: Counter = Counter()
    for index, item in enumerate(yaml.safe_load((HERE / f"{name}.yaml").read_text())):
        first, other = item["expect"], second[f"{name}-{index:03d}"]
        answer = router.route(item["query"]).label
        kind = kind_of(first)
        counts[kind, "posts"] += 1
        counts[kind, "labels agree"] += other == first
        counts[kind, "router right"] += answer == first
        if other == first:
            counts[kind, "router right where labels agree"] += answer == first
    return counts


def report(name: str, counts: Counter) -> None:
    print(name)
    for kind in KINDS:
        posts, agree = counts[kind, "posts"], counts[kind, "labels agree"]
        print(
            f"  {kind:9s} labels agree {agree}/{posts}; router right {counts[kind, 'router right']}/{posts}, "
            f"{counts[kind, 'router right where labels agree']}/{agree} where the labels agree"
        )


def main() -> None:
    second = second_labels()
    router = Router.from_pack(SkillPack.load(DEFAULT_SKILLS_DIR))
    names = sorted({post_id.rsplit("-", 1)[0] for post_id in second}, key=lambda n: (len(n), n))
    for name in names:
        report(name, agreement(router, name, second))


if __name__ == "__main__":
    main()
