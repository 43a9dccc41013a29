"""The second, blind labellings of the real collections (evals/routing/labels/real_second_labels*.yaml).

Use: `second_labels()["real_test12-041"]` is the second labeller's label for post 41 of
evals/routing/real_test12.yaml. Each collection from real_test11 on, and real_dev and real_test, was
labelled a second time from the post's text alone by labellers who saw neither the first labels nor
the router. The skill model learns only from posts whose two labels agree (or that have one), and
`evals/routing/label_agreement.py` prints how often they agree.

Known limitations: the collections before real_test11 (except real_dev and real_test) have one label.
"""

from __future__ import annotations

from pathlib import Path

import yaml

LABELS = Path(__file__).with_name("routing") / "labels"
# the first labelling's ids were "dev-000" and "test-000"; the later ones name the set
OLD_PREFIXES = {"dev": "real_dev", "test": "real_test"}


def second_labels() -> dict[str, str]:
    """Post id ("real_test12-041") -> the second labeller's label, over every second labelling."""
    labels = {}
    for file in sorted(LABELS.glob("real_second_labels*.yaml")):
        for row in yaml.safe_load(file.read_text()):
            name, index = row["id"].rsplit("-", 1)
            labels[f"{OLD_PREFIXES.get(name, name)}-{index}"] = row["label"]
    return labels
