"""How far the real-post labels agree between two labellers, and how the router scores where they agree.

Run from the repository root: `python evals/routing/label_agreement.py`. For real_dev.yaml and real_test.yaml it
prints, per kind of label (routable, clarify, decline), how often the second labelling
(labels/real_second_labels.yaml: the text alone, no source address, no first labels) gives the first label, and
the router's answers on all posts and on the posts both labellers agree on (aggregates only: no post is
printed, so the test half stays unread).

Known limitations: one second labeller; its labels follow the same written label rules, so the agreement
measures how well the rules pin a post down, not how experts at large would label it.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tools"), str(ROOT)]

from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR, SkillPack  # noqa: E402
from torch_skills.skillpack.route import Router  # noqa: E402

HERE = Path(__file__).parent


def kind_of(label: str) -> str:
    return label if label in ("clarify", "decline") else "routable"


def main() -> None:
    second = {
        row["id"]: row["label"]
        for row in yaml.safe_load((HERE / "labels" / "real_second_labels.yaml").read_text())
    }
    router = Router.from_pack(SkillPack.load(DEFAULT_SKILLS_DIR))
    for name in ("real_dev", "real_test"):
        counts: Counter = Counter()
        for index, item in enumerate(yaml.safe_load((HERE / f"{name}.yaml").read_text())):
            first, other = item["expect"], second[f"{name.removeprefix('real_')}-{index:03d}"]
            answer = router.route(item["query"]).label
            kind = kind_of(first)
            counts[kind, "posts"] += 1
            counts[kind, "labels agree"] += other == first
            counts[kind, "router right"] += answer == first
            if other == first:
                counts[kind, "router right where labels agree"] += answer == first
        print(name)
        for kind in ("routable", "clarify", "decline"):
            posts, agree = counts[kind, "posts"], counts[kind, "labels agree"]
            print(
                f"  {kind:9s} labels agree {agree}/{posts}; router right {counts[kind, 'router right']}/{posts}, "
                f"{counts[kind, 'router right where labels agree']}/{agree} where the labels agree"
            )


if __name__ == "__main__":
    main()
