"""Route a symptom, question or pasted error to the specialist skills, using the router's tables.

Use `Router.from_pack(pack).route("loss becomes NaN with fp16")` -> `RouteResult` with `skills`
(reading order), `clarify` (one question when the query is too vague), `evidence` (the router
phrases each skill matched), `tools` and `confidence`. Everything it knows comes from
skills/using-pytorch-engineering/SKILL.md (see `router.py` for the structure), so editing that
file changes routing; nothing about PyTorch is hard-coded here.

How it scores, deterministically:
1. The query is normalized (synonyms from "Words users use", light stemming, stop words).
2. Each skill's phrases are matched by coverage: the idf-weighted share of a phrase's terms
   present in the query (a phrase counts from 50% coverage; error messages also match in order).
   A skill's score is the sum of its best phrase scores, with diminishing weight.
3. Precedence and common-mistake rules reorder the skills ("slow" + "amp" -> profile first).
4. With no real evidence, or a query that is only one of the vague phrasings, it asks the
   clarifying question of the closest "Ask one question first" row.

Known limitations: bag-of-terms matching: a symptom described in words the router never uses
(and no synonym maps) is not recognized; non-English text gets the clarifying question.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from pydantic import BaseModel, Field

from torch_skills.skillpack.loader import ROUTER_NAME, SkillPack
from torch_skills.skillpack.router import PrecedenceRule, RouterTable, parse_router
from torch_skills.skillpack.text import GLUE_WORDS, Synonyms, terms

MAX_QUERY_CHARS = 20_000  # longer input (a whole log) keeps its head and its tail, where errors are
KIND_WEIGHT = {"errors": 1.6, "keywords": 1.0, "symptoms": 1.2, "examples": 0.8}
MIN_COVERAGE = 0.5
MIN_EVIDENCE = 1.0  # below this best score the query is too vague to route
TERM_WEIGHT = 0.35  # weight of single distinctive terms, next to whole phrases
FOLLOW_RATIO = 0.45  # a second skill is listed when it scores this share of the first
# A precedence rule reorders only when its first skill has this share of the top score; a rule with
# a single condition ("nan" -> debugging) needs more evidence than one with two ("nan" + "amp").
RULE_MIN_SHARE = {True: 0.25, False: 0.6}
DEFAULT_QUESTION = "What goes wrong: an error message (paste it), out of memory, NaN loss, slow steps, or a loss that does not go down?"


class RouteResult(BaseModel):
    """Where a query belongs: skills in reading order, or one question to ask first."""

    skills: list[str] = Field(
        description="skills in reading order; the first is where to start (empty when clarify is set)"
    )
    clarify: str | None = Field(
        default=None, description="one clarifying question to ask when the query is too vague"
    )
    evidence: dict[str, list[str]] = Field(
        default_factory=dict, description="router phrases each listed skill matched in the query"
    )
    tools: list[str] = Field(
        default_factory=list, description="diagnostic tools the router names for the first skill"
    )
    rule: str | None = Field(default=None, description="the precedence rule that set the order, when one did")
    confidence: float = Field(description="0 to 1: how clearly the evidence points at the first skill")
    scores: dict[str, float] = Field(
        default_factory=dict, description="raw score per skill, for debugging routing"
    )
    summary: str


@dataclass(frozen=True)
class _Phrase:
    skill: str
    kind: str
    text: str
    terms: tuple[str, ...]


def _truncate(query: str) -> str:
    if len(query) <= MAX_QUERY_CHARS:
        return query
    head = MAX_QUERY_CHARS * 2 // 3
    return query[:head] + "\n" + query[-(MAX_QUERY_CHARS - head) :]


class Router:
    def __init__(self, table: RouterTable):
        self.table = table
        self.synonyms = Synonyms(table.synonyms)
        self.phrases: list[_Phrase] = []
        for skill, section in table.routes.items():
            for kind, text in section.all_phrases():
                t = tuple(dict.fromkeys(terms(text, self.synonyms)))
                if t:
                    self.phrases.append(_Phrase(skill, kind, text, t))
        # idf over skills: a term used by every skill's phrases carries no routing signal.
        df: Counter[str] = Counter()
        for skill in table.routes:
            df.update({t for p in self.phrases if p.skill == skill for t in p.terms})
        n = len(table.routes)
        self.idf = {t: math.log(1 + n / c) for t, c in df.items()}
        # sharper idf for single terms: zero for a term every skill uses
        self.term_idf = {t: math.log(n / c) for t, c in df.items()}
        self.vocab = {s: {t for p in self.phrases if p.skill == s for t in p.terms} for s in table.routes}
        self.rules = [(r, self._rule_terms(r)) for r in table.precedence]
        self.vague = [
            (case, [tuple(terms(p, self.synonyms)) for p in case.phrasings]) for case in table.ambiguous
        ]

    @classmethod
    def from_pack(cls, pack: SkillPack) -> Router:
        return cls(parse_router(pack.get(ROUTER_NAME).body))

    def _rule_terms(self, rule: PrecedenceRule) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
        def conv(items: list[str]) -> list[tuple[str, ...]]:
            return [t for t in (tuple(terms(i, self.synonyms, GLUE_WORDS)) for i in items) if t]

        return conv(rule.terms), conv(rule.together_with)

    # -- scoring --------------------------------------------------------------------------------
    def _phrase_score(self, phrase: _Phrase, query: set[str], ordered: list[str]) -> float:
        weights = [self.idf.get(t, 0.0) for t in phrase.terms]
        total = sum(weights)
        if total <= 0:
            return 0.0
        matched = sum(w for t, w in zip(phrase.terms, weights, strict=True) if t in query)
        coverage = matched / total
        if len(phrase.terms) == 1:
            coverage = 1.0 if phrase.terms[0] in query else 0.0
        if coverage < MIN_COVERAGE:
            return 0.0
        score = KIND_WEIGHT[phrase.kind] * coverage**2 * (1 + math.log1p(matched))
        if phrase.kind == "errors" and len(phrase.terms) >= 3 and _in_order(phrase.terms, ordered):
            score *= 1.5  # a pasted error message, word for word
        return score

    def scores(self, query: str) -> tuple[dict[str, float], dict[str, list[str]], list[str]]:
        ordered = terms(query, self.synonyms)
        qset = set(ordered)
        per_skill: dict[str, list[tuple[float, str]]] = {s: [] for s in self.table.routes}
        for phrase in self.phrases:
            s = self._phrase_score(phrase, qset, ordered)
            if s > 0:
                per_skill[phrase.skill].append((s, phrase.text))
        scores, evidence = {}, {}
        for skill, hits in per_skill.items():
            hits.sort(reverse=True)
            # diminishing returns: the best phrase counts fully, the next ones less and less
            phrase_score = sum(s / (1 + i) for i, (s, _) in enumerate(hits[:6]))
            term_score = TERM_WEIGHT * sum(self.term_idf[t] for t in qset & self.vocab[skill])
            scores[skill] = round(phrase_score + term_score, 3)
            evidence[skill] = [text for _, text in hits[:5]]
        return scores, evidence, ordered

    def _fired_rule(self, qset: set[str], scores: dict[str, float]) -> PrecedenceRule | None:
        """The most specific rule whose terms the query mentions and whose first skill has evidence."""
        top = max(scores.values(), default=0.0)
        best: tuple[int, int, PrecedenceRule] | None = None
        for index, (rule, (first_terms, second_terms)) in enumerate(self.rules):
            if scores.get(rule.first, 0.0) < RULE_MIN_SHARE[bool(second_terms)] * top:
                continue
            if not any(set(t) <= qset for t in first_terms):
                continue
            if second_terms and not any(set(t) <= qset for t in second_terms):
                continue
            specificity = 1 if second_terms else 0
            key = (-specificity, index)
            if best is None or key < best[:2]:
                best = (*key, rule)
        return best[2] if best else None

    def _vague_question(self, qset: set[str], ordered: list[str]) -> tuple[str | None, float]:
        """(question of the closest vague phrasing, how much of the query that phrasing explains)."""
        best_q, best = None, 0.0
        for case, phrasings in self.vague:
            for p in phrasings:
                if not p:
                    continue
                covered = len(set(p) & qset) / len(set(p))
                explains = len(set(p) & qset) / max(1, len(qset))
                score = covered * explains
                if covered >= 0.6 and score > best:
                    best_q, best = case.question, score
        return best_q, best

    # -- the answer -----------------------------------------------------------------------------
    def route(self, query: str) -> RouteResult:
        query = _truncate(query or "")
        scores, evidence, ordered = self.scores(query)
        qset = set(ordered)
        loose = set(terms(query, self.synonyms, GLUE_WORDS))
        ranked = sorted(scores, key=lambda s: (-scores[s], s))
        top = scores[ranked[0]] if ranked else 0.0
        question, vagueness = self._vague_question(qset, ordered)
        if top < MIN_EVIDENCE or (question is not None and vagueness >= 0.5 and top < 2 * MIN_EVIDENCE):
            return RouteResult(
                skills=[],
                clarify=question or DEFAULT_QUESTION,
                evidence={s: evidence[s] for s in ranked if evidence[s]},
                confidence=0.0,
                scores=scores,
                summary="The query names no specific symptom; ask the question, then route on the answer.",
            )
        rule = self._fired_rule(loose, scores)
        order: list[str] = []
        if rule is not None:
            order = [rule.first, *[s for s in rule.then if s != rule.first]]
        for skill in ranked:
            if skill not in order and scores[skill] >= FOLLOW_RATIO * top and len(order) < 3:
                order.append(skill)
        order = [s for s in order if s in self.table.routes]
        first = order[0]
        second = max((scores[s] for s in ranked if s != first), default=0.0)
        margin = max(0.0, (scores[first] - second) / max(scores[first], 1e-9))
        strength = 1 - math.exp(-scores[first] / 4)
        confidence = round(strength * (0.5 + 0.5 * margin), 2)
        tools = self.table.routes[first].tools
        why = f" ({rule.why})" if rule is not None and rule.why else ""
        summary = f"Start with {first}{why}" + (f", then {', '.join(order[1:])}." if len(order) > 1 else ".")
        if tools:
            summary += f" Run {' / '.join(tools)} on the user's code first."
        return RouteResult(
            skills=order,
            evidence={s: evidence[s] for s in order if evidence.get(s)},
            tools=tools,
            rule=f"{rule.source} table, line {rule.line}" if rule else None,
            confidence=confidence,
            scores=scores,
            summary=summary,
        )


def _in_order(needle: tuple[str, ...], haystack: list[str]) -> bool:
    """Whether needle's terms appear in haystack in the same order (not necessarily adjacent)."""
    it = iter(haystack)
    return all(any(h == t for h in it) for t in needle)
