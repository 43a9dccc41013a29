"""Word statistics of the router's labelled example questions: which skill a wording points at.

Use `model = ExampleModel.fit(table.examples, router_phrases, featurize)`, then
`model.probabilities(featurize(query))` -> {skill: probability}. `route.Router` builds one from the
`## Labelled examples` of the router skill (references/routing-examples.md) and blends it with
its phrase matching, so a symptom worded the way users word it routes like the examples that
share its words, even when no router phrase says it.

The model is a naive Bayes classifier over binary features (a question's terms and its pairs of
adjacent terms, as `featurize` makes them), with additive smoothing. Each route phrase of the
router counts as one more short example of its skill, so a skill with few examples still knows its
own vocabulary. Deterministic, dependency-free and fast: fitting 2,000 examples takes well under
a second, and a query costs one pass over its features per skill.

Known limitations: naive Bayes counts every feature as independent evidence, so its
probabilities are extreme (0.999 or 1e-20 rather than 0.7); route() uses them as votes and
thresholds, not as calibrated odds. It knows words, not meaning; a question worded unlike every example and every
phrase gets the class priors (the number of examples per skill), which is why route() adds it to
the phrase scores instead of replacing them. It reads no word order beyond adjacent pairs.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import pairwise

from torch_skills.skillpack.router import LabelledExample

SMOOTHING = 0.1  # additive smoothing of each feature's count per skill


def with_pairs(terms: list[str]) -> set[str]:
    """A question's features: its terms and each pair of adjacent terms ('out_memory')."""
    return set(terms) | {f"{a}_{b}" for a, b in pairwise(terms)}


@dataclass(frozen=True)
class ExampleModel:
    """Per-skill feature log-probabilities learned from labelled examples; see the module docstring."""

    skills: tuple[str, ...]
    log_prior: dict[str, float]
    log_likelihood: dict[str, dict[str, float]]  # skill -> feature -> log P(feature | skill)
    log_unseen: dict[str, float]  # skill -> log P(a known feature the skill never showed)
    vocabulary: frozenset[str]  # every feature some skill showed: the only ones that move the odds

    @classmethod
    def fit(
        cls,
        examples: Iterable[LabelledExample],
        phrases: Iterable[tuple[str, list[str]]],
        featurize: Callable[[str], set[str]],
        skills: Iterable[str],
    ) -> ExampleModel:
        """Learn from `examples` (their text through `featurize`) and the router's `phrases`
        ((skill, terms) pairs, one per route phrase) for the given `skills`."""
        names = tuple(skills)
        counts: dict[str, Counter[str]] = {s: Counter() for s in names}
        documents: Counter[str] = Counter()
        for example in examples:
            if example.skill in counts:
                counts[example.skill].update(featurize(example.text))
                documents[example.skill] += 1
        for skill, terms in phrases:
            if skill in counts and terms:
                counts[skill].update(with_pairs(terms))
                documents[skill] += 1
        vocabulary = frozenset().union(*counts.values())
        total_documents = sum(documents.values()) or 1
        log_prior, log_likelihood, log_unseen = {}, {}, {}
        for skill in names:
            total = sum(counts[skill].values()) + SMOOTHING * len(vocabulary)
            log_prior[skill] = math.log((documents[skill] + 1) / (total_documents + len(names)))
            log_likelihood[skill] = {f: math.log((c + SMOOTHING) / total) for f, c in counts[skill].items()}
            log_unseen[skill] = math.log(SMOOTHING / total) if total > 0 else 0.0
        return cls(names, log_prior, log_likelihood, log_unseen, vocabulary)

    def probabilities(self, features: set[str]) -> dict[str, float]:
        """P(skill | the query's features), summing to 1 (the priors when no feature is known)."""
        if not self.skills:
            return {}
        seen = features & self.vocabulary
        log_posterior = {
            s: self.log_prior[s] + sum(self.log_likelihood[s].get(f, self.log_unseen[s]) for f in seen)
            for s in self.skills
        }
        top = max(log_posterior.values())
        weights = {s: math.exp(v - top) for s, v in log_posterior.items()}
        total = sum(weights.values())
        return {s: w / total for s, w in weights.items()}
