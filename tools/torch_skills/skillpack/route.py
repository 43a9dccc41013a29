"""Route a symptom, question or pasted error to the specialist skills, using the router's tables.

Use `Router.from_pack(pack).route("loss becomes NaN with fp16")` -> `RouteResult` with `status`
("routed", "clarify" or "out_of_scope"), `skills` (reading order), `clarify` (one question when
the post names no symptom), `reason` (why it is out of scope), `evidence` (the router phrases each
skill matched), `scores`, `tools` and `confidence`. Everything it knows comes from the router
skill, skills/using-pytorch-engineering/ (SKILL.md and references/routing-terms.md; see
`router.py` for the structure), except two small models learned from labelled posts
(`post_model.py`): the gate that may overrule an ask (step 2) and the first skill of a routed post
(step 3). Edit those files to change routing, then retrain the models (`python -m
evals.post_model_training`: the phrase scores and the rules' verdict are their inputs); nothing
about PyTorch is hard-coded here.

How it decides (deterministic):
0. Read: fold full-width forms; drop the "Not evidence" lines (a `collect_env` dump, issue-
   template headings, a drawn `nvidia-smi` table, a progress bar); apply "Words users use" (a
   CJK character is a word; a phrase matches inflected and without articles); stem. Score each
   skill: the idf-weighted share of each of its phrases found in the post (from 50%), best
   phrases first with diminishing weight, plus its single terms; a line that opens with one
   skill's error message word for word counts for that skill only. A *symptom* is a symptom,
   error or example phrase found (80%) through a word that is not a topic term (keywords, setup
   and topic words); it is *described* when a symptom or example phrase found in part (from 50%)
   through such a word scores SYMPTOM_MIN ("RAM grows a bit").
1. Decline when another framework's code or log shows (an `on sight` sign: `model.add(`, a
   Keras progress bar, `ttnn`, an import line, a runtime's version in the post's environment),
   when an "Out of scope" topic's signs outweigh the skills' evidence as its row says (a post
   that names PyTorch keeps the `unless` topics; one that names a symptom keeps the `when it
   outweighs` ones: "explain why training is slow" is profiling), or when an English post shows
   no ML word, no code name and no whole phrase.
2. Ask the "Ask one question first" question when the post is a bare topic name, or makes a
   project request ("the link to the weights is dead"; or a `/.../` pattern of that row in the
   prose: "could you share the model weights?") and names no symptom, or names no
   symptom (found or described) and no API (a code name, `torch.gather`, `.contiguous()`, one
   of whose parts is evidence) and: has no evidence, or its evidence is one term
   ("checkpoint") that no question of the post asks about or that a project request asks
   for, or single words with no phrase, or it says a vague phrasing, a help word, a
   review phrase or a setup list while none of its questions names anything routable (a
   question with a review phrase, which includes questions to a project's authors, "is it as
   fast as the paper?", needs a symptom; a title that asks gives way to a body question on its
   topic), unless the gate model (every labelled post, the rules' verdict among its inputs) finds
   the post routable with probability GATE_ROUTES (`post_model.py`).
3. Otherwise route: the first skill is the post model's (logistic regression over the post's
   words, its title's words, its runs of four characters and the eight phrase scores, learned
   from the routable real posts, but those two blind labellers put on different skills;
   it replaced the precedence rows, which lost more right answers than they won on posts nobody
   had tuned on); then the skills scoring FOLLOW_RATIO of the top phrase score, three at most.
   `confidence` is the model's probability for the first skill; the summary calls a close call
   under CLOSE_CALL and "likely, not sure" under SURE. The "Precedence" and "Common routing
   mistakes" tables are advice for agents.

Known limitations: bag-of-words matching: a symptom in words no phrase or synonym has is not
recognized, and a post that only names a topic plus a code name is routed on that topic. The
phrases and rules read English and the Chinese, Japanese and Korean words of "Words users use"; the two
models also read runs of characters, so a post in another language is routed only when the gate
is sure of it, and otherwise gets the clarifying question. A question about another framework that shows none of its signs is routed
as if it were PyTorch. Truncation stemming conflates some words ('parametrize'/'parameter').
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from torch_skills.skillpack.loader import ROUTER_NAME, SkillPack
from torch_skills.skillpack.post_model import GATE_FILE, PostModel, gate_routes_asked_post, post_features
from torch_skills.skillpack.router import (
    OutOfScopeTopic,
    RouterFormatError,
    RouterTable,
    parse_router,
)
from torch_skills.skillpack.text import GLUE_WORDS, Synonyms, is_cjk, normalize, terms, tokens

GENERIC_TOPIC = "Not machine learning"
GENERIC_SAY = (
    "The question names nothing about machine learning or PyTorch; this pack covers making "
    "PyTorch code work and run fast."
)
MAX_QUERY_CHARS = 20_000  # longer input (a whole log) keeps its head and its tail, where errors are
KIND_WEIGHT = {"errors": 1.6, "keywords": 1.0, "symptoms": 1.2, "examples": 0.8}
MIN_COVERAGE = 0.5
MIN_EVIDENCE = 1.0  # below this best score the query is too vague to route
TERM_WEIGHT = 0.35  # weight of single distinctive terms, next to whole phrases
FOLLOW_RATIO = 0.45  # after the first skill, the skills whose phrase score is this share of the top
# Below this probability the post model's first skill is a close call (it is more likely wrong
# than right), and the summary says so when a second skill is listed.
CLOSE_CALL = 0.5
# From this probability the first skill is sure enough to start without weighing the second: on
# real posts the model had not learned from it was right on 2,798 of 2,901 (leave-one-collection-
# out, twenty-eight collections) and on 123 of 125, 112 of 116 and 115 of 116 (the thirty-fifth
# to thirty-seventh collections, scored fresh); between CLOSE_CALL and SURE on 17 of 25, 18 of 26
# and 11 of 20 there, under CLOSE_CALL on 10 of 21 (evals/routing/README.md).
SURE = 0.9
# A post that says a vague phrasing ("any ideas?") is routed only when a symptom, error or example
# phrase (not just topic keywords) scores at least this much ("names a symptom").
SYMPTOM_MIN = 1.5
SYMPTOM_COVERAGE = 0.8  # ... and that phrase is (nearly) all there
SYMPTOM_KINDS = ("symptoms", "errors", "examples")
# a symptom in the user's own words ("RAM grows a bit every epoch") matches a symptom or example
# phrase in part (from MIN_COVERAGE); a pasted error matches word for word or not at all
DESCRIBED_KINDS = ("symptoms", "examples")
# Out of scope: how much of the best skill score a topic's signs must reach to decline. A topic
# that holds "unless PyTorch is named" needs one sign; "when it outweighs" (theory, plain Python,
# PyTorch not named) a fifth; "always" (installs, PyTorch named or not) more, so that "pip install"
# in passing does not decline a real PyTorch problem.
OUTWEIGHS = {"unless": 0.0, "outweighs": 0.2, "always": 0.4, "on sight": 0.0}
SIGN_GAP = 2  # words of a multi-word sign may have this many other terms between them
MESSAGE_LEAD = (
    3  # a line is a pasted message's when the message starts within its first terms ("RuntimeError:")
)
# A symptomless post that asks for help or lists its setup is vague unless one of its questions
# names something routable on its own.
QUESTION_MIN = 1.5  # a question sentence scoring this much on its own names something routable
MAX_QUESTIONS = 20  # question sentences read on their own (a pasted log can hold thousands)
BARE_TOPIC_WORDS = 3  # a post of at most this many words, all topic terms, names a topic, not a problem
SETUP_MIN = 2  # this many setup words next to a number ("lr 3e-4", "batch 64") list a setup
# the "Ask one question first" row whose question a post gets, with no symptom, whatever its questions name
PROJECT_REQUEST = "project request"
_SENTENCE = re.compile(r"(?<=[?!])\s+|(?<=\.)\s+(?=[A-Za-z])|\n+")
# the clauses of a sentence: what the last one asks is the question ("torch 2.5, any known issues?")
_CLAUSE = re.compile(r"[,;:]\s+|\.+\s+|\s+[-\u2013\u2014]+\s+|\)\s+")
_ASKING = frozenset(
    "how what whats which why when where should can could is are does do did will would any anyone".split()
)
# who a question addresses or points at ("can you", "fix it"): no topic of its own
_ADDRESSED = frozenset("i me my you your it this that we our someone somebody please".split())
# words of a question that points back at the sentence before it ("How can I do that?")
_PRONOUN_ASK = frozenset("do done that this way easy easily possible there any".split())
_LINE_LEAD = re.compile(r"^[^A-Za-z0-9\[/_]+")
_HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)
NEGATED = frozenset({"not", "no"})  # a phrase with one of these needs a negation in the query
NEGATED_SHORT = 2  # ... when it has at most this many other terms
_NEGATION = re.compile(  # negations and failure verbs: "doesn't work" and "breaks" both negate
    r"\b(?:not|no|never|none|nothing|nobody|cannot|without|neither|nor|fail(?:s|ed|ing)?|refuses?|"
    r"break(?:s|ing)?|broke|broken|crash(?:es|ed|ing)?|stops?|stopped|"
    r"(?:do|does|did|is|are|was|were|wo|ca|have|has|had|could|would|should|ai)n['\u2019]?t)\b",
    re.I,
)
_DISCOURSE = re.compile(r"(^|[.!?\n]\s*)(?:ok|okay|alright)\b[,.!:]?", re.I)
_TECHNICAL_YES_NO = re.compile(
    r"\b(?:is|are)\s+(?:it|this|that)\s+(?:ok|okay|fine|safe|correct|valid|legal)\s+to\b", re.I
)
_NUMBER = re.compile(r"^[\d.]+$")
_METHOD_CALL = re.compile(r"\.([A-Za-z_]\w*)\(")  # a method written as a call: ').contiguous()'

_BOX_LEAD = ("|", "+")  # lines of a drawn table (nvidia-smi)
DEFAULT_QUESTION = "What goes wrong: an error message (paste it), out of memory, NaN loss, slow steps, or a loss that does not go down?"


class RouteResult(BaseModel):
    """Where a query belongs: skills in reading order, one question to ask first, or out of scope."""

    status: Literal["routed", "clarify", "out_of_scope"] = Field(
        description="routed: read `skills`; clarify: ask `clarify` first; out_of_scope: not PyTorch "
        "engineering, say `reason` and route nothing"
    )
    skills: list[str] = Field(
        description="skills in reading order; the first is where to start (empty unless status is routed)"
    )
    clarify: str | None = Field(
        default=None, description="one clarifying question to ask when the post names no symptom"
    )
    out_of_scope: str | None = Field(
        default=None, description="the out-of-scope topic the query is about (status out_of_scope)"
    )
    reason: str | None = Field(default=None, description="why the query is out of scope, to tell the user")
    out_of_scope_signs: list[str] = Field(
        default_factory=list, description="the out-of-scope signs the query showed (status out_of_scope)"
    )
    ignored_lines: int = Field(
        default=0, description="lines dropped as not evidence (collect_env dump, issue-template headings)"
    )
    evidence: dict[str, list[str]] = Field(
        default_factory=dict, description="router phrases each listed skill matched in the query"
    )
    tools: list[str] = Field(
        default_factory=list, description="diagnostic tools the router names for the first skill"
    )
    confidence: float = Field(
        description="0 to 1; routed: the post model's probability for the first skill (from 0.9 it was right on "
        "93-100% of real posts it had not seen, under 0.5 a close call); out_of_scope: how clearly; 0 for clarify"
    )
    scores: dict[str, float] = Field(
        default_factory=dict, description="raw score per skill, for debugging routing"
    )
    summary: str

    @property
    def label(self) -> str:
        """The answer as the eval sets label a post: the first skill, 'clarify' or 'decline'."""
        return {"clarify": "clarify", "out_of_scope": "decline"}.get(self.status) or self.skills[0]


@dataclass(frozen=True)
class _Phrase:
    skill: str
    kind: str
    text: str
    terms: tuple[str, ...]


@dataclass(frozen=True)
class _Evidence:
    scores: dict[str, float]  # skill -> score
    phrases: dict[str, list[str]]  # skill -> the router phrases it matched, best first
    ordered: list[str]  # the query's terms, in order
    symptom: dict[str, float]  # skill -> best symptom, error or example phrase (not a keyword)
    described: dict[str, float]  # skill -> best symptom or example phrase found in part (MIN_COVERAGE)
    pasted: set[str]  # skills with an error message pasted word for word
    terms: dict[str, set[str]]  # skill -> the query's terms that count for it (numbers aside)
    whole: set[str]  # skills with a phrase (nearly) all there, at SYMPTOM_COVERAGE


def _diminishing(best_first: list[float]) -> float:
    """The best score counts fully, the next ones less and less (the best six; sorted by the caller)."""
    return sum(s / (1 + i) for i, s in enumerate(best_first[:6]))


def _truncate(query: str) -> str:
    if len(query) <= MAX_QUERY_CHARS:
        return query
    head = MAX_QUERY_CHARS * 2 // 3
    return query[:head] + "\n" + query[-(MAX_QUERY_CHARS - head) :]


class Router:
    def __init__(self, table: RouterTable):
        if not any(phrase for section in table.routes.values() for phrase in section.all_phrases()):
            raise RouterFormatError(
                "the router table has no route phrases: parse SKILL.md together with references/routing-terms.md"
            )
        self.table = table
        self.synonyms = Synonyms(table.synonyms)
        self.project_request_asks = frozenset(
            case.question for case in table.ambiguous if PROJECT_REQUEST in case.phrasings
        )
        if not self.project_request_asks:
            raise RouterFormatError(
                f'"Ask one question first" has no "{PROJECT_REQUEST}" row: routing-terms.md'
            )
        # the terms of what a project request asks for ("share the checkpoint", "upload the weights"):
        # a question whose one keyword is among them asks about the project's files, not a problem
        self.project_terms = frozenset(
            t for said, read in table.synonyms.items() if read == PROJECT_REQUEST for t in terms(said)
        )
        self.post_model = PostModel.load()
        self.gate_model = PostModel.load(GATE_FILE)
        for known in (
            set(self.post_model.labels),
            set(self.post_model.score_weights),
            set(self.gate_model.score_weights),
        ):
            if known != set(table.routes):
                raise RouterFormatError(
                    f"the post models know the skills {sorted(known)} but the router table "
                    f"routes to {sorted(table.routes)}: retrain them with `python -m evals.post_model_training`"
                )
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
        # error messages long enough to recognize when pasted (a pasted message shows PyTorch is in use)
        self.verbatim = frozenset(p for p in self.phrases if p.kind == "errors" and len(p.terms) >= 3)
        # a phrasing written /.../ is a regular expression on the post's prose: a request whose words
        # vary too much to list ("could you please share all the pretrained weights")
        worded = [(case, [p for p in case.phrasings if not _is_pattern(p)]) for case in table.ambiguous]
        self.ask_patterns = [
            (case.question, re.compile(p[1:-1]))
            for case in table.ambiguous
            for p in case.phrasings
            if _is_pattern(p)
        ]
        self.vague = [(case, [tuple(terms(p, self.synonyms)) for p in said]) for case, said in worded]
        # multi-word help and review words match as a sequence: "double-check" is not "check"
        self.help_words = [t for h in table.help_words if (t := tuple(_words(h)))]
        # review words are phrases with their small words ("review my"), matched in the raw text
        self.review = (
            re.compile(r"\b(?:" + "|".join(_phrase_pattern(w) for w in table.review_words) + r")\b")
            if table.review_words
            else None
        )
        # "Not evidence": a prefix ending in a letter or digit is a heading (the whole line); one
        # ending in "*" or punctuation drops every line that starts with it
        self._headings = frozenset(p for p in table.not_evidence if p[-1].isalnum())
        self._line_prefixes = tuple(p.rstrip("*") for p in table.not_evidence if not p[-1].isalnum())
        self.setup_words = frozenset(w.lower() for w in table.setup_words)
        # topic terms name what the user works with, not what goes wrong: every skill's keywords,
        # the setup words and the "Topic words"; a phrase matched only on them names no symptom
        self.topic_terms = frozenset(
            t for p in self.phrases if p.kind == "keywords" for t in p.terms
        ) | frozenset(t for w in (*table.setup_words, *table.topic_words) for t in terms(w, self.synonyms))
        self.vague_loose = [
            (case, [tuple(terms(p, self.synonyms, GLUE_WORDS)) for p in said]) for case, said in worded
        ]
        # ... and as sets: a question made of one of them and asking words names nothing
        self.vague_term_sets = [frozenset(p) for _, phrasings in self.vague_loose for p in phrasings if p]
        # signs are matched word for word, unstemmed: "tensorflow" must not match "tensor"
        self.anchors = [t for t in (tuple(_words(s)) for s in table.pytorch_signs) if t]
        self.shared_anchors = [t for t in (tuple(_words(s)) for s in table.shared_signs) if t]
        self.topics = [
            (topic, [(s, t) for s in topic.signs if not _is_pattern(s) and (t := tuple(_words(s)))])
            for topic in table.out_of_scope
        ]
        # "on sight" signs written /.../ are regular expressions on the raw post
        self.patterns = {
            topic.topic: [(sign, re.compile(sign[1:-1])) for sign in topic.signs if _is_pattern(sign)]
            for topic in table.out_of_scope
        }
        self.ml_words = [t for t in (tuple(_words(w)) for w in table.ml_words) if t]

    @classmethod
    def from_pack(cls, pack: SkillPack) -> Router:
        """The router of a loaded skill pack: the router's SKILL.md body and its references/*.md."""
        skill = pack.get(ROUTER_NAME)
        references = {
            f.path: pack.read(ROUTER_NAME, f.path).decode("utf-8")
            for f in skill.files
            if f.path.startswith("references/") and f.path.endswith(".md")
        }
        return cls(parse_router(skill.body, references))

    # -- scoring --------------------------------------------------------------------------------
    def _phrase_score(
        self, phrase: _Phrase, query: set[str], ordered: list[str], negated: bool = True
    ) -> tuple[float, float]:
        """(score, coverage) of one phrase; a pasted error message, word for word, scores 1.5x.
        A short phrase with a negation ("not learning") needs a query that negates something (`negated`):
        on one or two words it would match its opposite ("a learned temperature")."""
        weights = [self.idf.get(t, 0.0) for t in phrase.terms]
        total = sum(weights)
        if total <= 0:
            return 0.0, 0.0
        if not negated and NEGATED & set(phrase.terms) and len(set(phrase.terms) - NEGATED) <= NEGATED_SHORT:
            return 0.0, 0.0  # "not learning" is the opposite of "a learned temperature"
        matched = sum(w for t, w in zip(phrase.terms, weights, strict=True) if t in query)
        coverage = matched / total
        if len(phrase.terms) == 1:
            coverage = 1.0 if phrase.terms[0] in query else 0.0
        if coverage < MIN_COVERAGE:
            return 0.0, coverage
        score = KIND_WEIGHT[phrase.kind] * coverage**2 * (1 + math.log1p(matched))
        if phrase.kind == "errors" and len(phrase.terms) >= 3 and _in_order(phrase.terms, ordered):
            score *= 1.5
        return score, coverage

    def scores(self, query: str) -> tuple[dict[str, float], dict[str, list[str]], list[str]]:
        """(score per skill, matched phrases per skill, the query's terms in order)."""
        found = self._evidence(normalize(query))
        return found.scores, found.phrases, found.ordered

    def _evidence(self, query: str) -> _Evidence:
        ordered = terms(query, self.synonyms)
        qset = set(ordered)
        negated = bool(NEGATED & qset) or _NEGATION.search(query) is not None
        per_skill: dict[str, list[tuple[float, str]]] = {s: [] for s in self.table.routes}
        hit_terms: dict[str, set[str]] = {s: set() for s in self.table.routes}
        whole: set[str] = set()
        symptom: dict[str, float] = dict.fromkeys(self.table.routes, 0.0)
        described: dict[str, float] = dict.fromkeys(self.table.routes, 0.0)
        pasted: set[str] = set()
        seen = self._seen_by_skill(query, qset, ordered)
        for phrase in self.phrases:
            q_ordered, q_set = seen.get(phrase.skill, (ordered, qset))
            s, coverage = self._phrase_score(phrase, q_set, q_ordered, negated)
            if s > 0:
                per_skill[phrase.skill].append((s, phrase.text))
                hit_terms[phrase.skill].update(t for t in phrase.terms if t in q_set and not _NUMBER.match(t))
                if coverage >= SYMPTOM_COVERAGE:
                    whole.add(phrase.skill)
                told = [t for t in phrase.terms if t in q_set and t not in self.topic_terms]
                if phrase.kind in SYMPTOM_KINDS and told and coverage >= SYMPTOM_COVERAGE:
                    symptom[phrase.skill] = max(symptom[phrase.skill], s)
                if phrase.kind in DESCRIBED_KINDS and set(told) - NEGATED:
                    described[phrase.skill] = max(described[phrase.skill], s)
                if phrase in self.verbatim and set(phrase.terms) <= qset and _in_order(phrase.terms, ordered):
                    pasted.add(phrase.skill)
        scores, evidence = {}, {}
        for skill, hits in per_skill.items():
            hits.sort(reverse=True)
            # diminishing returns: the best phrase counts fully, the next ones less and less
            phrase_score = _diminishing([s for s, _ in hits])
            # a bare number ('2' of a version 2.3.1, '10' of CIFAR-10) is context, not a term of a skill
            own = {t for t in seen.get(skill, (ordered, qset))[1] & self.vocab[skill] if not _NUMBER.match(t)}
            term_score = TERM_WEIGHT * sum(self.term_idf[t] for t in own)
            hit_terms[skill] |= {t for t in own if self.term_idf[t] > 0}
            scores[skill] = round(phrase_score + term_score, 3)
            evidence[skill] = [text for _, text in hits[:5]]
        return _Evidence(scores, evidence, ordered, symptom, described, pasted, hit_terms, whole)

    def _seen_by_skill(
        self, query: str, qset: set[str], ordered: list[str]
    ) -> dict[str, tuple[list[str], set[str]]]:
        """The query's terms as each skill may read them, for the skills that may not read it whole:
        a line that opens with another skill's error message word for word is that message's (the words
        of a pasted DDP error that names `checkpoint` and "reentrant backward" are not custom-autograd
        evidence); a message quoted inside a sentence leaves the sentence to every skill. Skills whose
        view is the whole query are left out."""
        if not any(set(p.terms) <= qset for p in self.verbatim):
            return {}
        lines = [terms(line, self.synonyms) for line in query.splitlines()]
        words = [
            _unnumbered(line) for line in lines
        ]  # a message's values ('[64, 3, 7, 7]') are not its words
        holders: list[set[str]] = [set() for _ in lines]
        for phrase in self.verbatim:
            if set(phrase.terms) <= qset and _in_order(phrase.terms, ordered):
                needle = tuple(_unnumbered(phrase.terms))
                for held, line in zip(holders, words, strict=True):
                    if needle and any(
                        _sequence_at(needle, line, k) for k in range(min(MESSAGE_LEAD + 1, len(line)))
                    ):
                        held.add(phrase.skill)
        seen = {}
        for skill in self.table.routes:
            if any(held and skill not in held for held in holders):
                kept = [
                    t
                    for held, line in zip(holders, lines, strict=True)
                    if not held or skill in held
                    for t in line
                ]
                seen[skill] = (kept, set(kept))
        return seen

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

    # -- what counts as evidence ----------------------------------------------------------------
    def _drop_not_evidence(self, query: str) -> tuple[str, int]:
        """The query without the lines the "Not evidence" table names, and how many were dropped.

        An HTML comment (an issue template's guidance) is dropped too, and so is a whole block of
        box-drawn lines (starting with '|' or '+', as `nvidia-smi` prints) when one of its lines is,
        and a progress bar's line (its rate is how fast it ran, not a complaint)."""
        if not self.table.not_evidence:
            return query, 0
        query = _HTML_COMMENT.sub("", query)
        lines = query.splitlines()
        drop = []
        for line in lines:
            key = " ".join(_LINE_LEAD.sub("", line.strip()).lower().split())  # nvidia-smi pads with spaces
            drop.append(
                bool(key)
                and (
                    key.startswith(self._line_prefixes)
                    or key.rstrip(" :.!?*_") in self._headings
                    or _PROGRESS_LINE.search(line) is not None
                )
            )
        start = 0
        while start < len(lines):  # box-drawn blocks go whole with any line of theirs
            end = start
            while end < len(lines) and lines[end].lstrip().startswith(_BOX_LEAD):
                end += 1
            if end > start and any(drop[start:end]):
                drop[start:end] = [True] * (end - start)
            start = max(end, start + 1)
        kept = [line for line, gone in zip(lines, drop, strict=True) if not gone]
        return "\n".join(kept), sum(drop)

    def _names_pytorch(self, words: _Positions) -> bool:
        return any(words.near(sign) for sign in self.anchors)

    def _names_shared(self, words: _Positions) -> bool:
        """Whether the query uses an API name PyTorch shares with other frameworks (nn.Module)."""
        return any(words.near(sign) for sign in self.shared_anchors)

    def _out_of_scope(
        self, words: _Positions, named: bool, top: float = 0.0, shared: bool = False, raw: str = ""
    ) -> tuple[OutOfScopeTopic | None, float, list[str]]:
        """The out-of-scope topic whose signs most exceed what it needs to decline (its "Declines"
        share of the best skill score `top`), its score and the signs seen. `named`: a PyTorch sign
        is there; `shared`: an API name PyTorch shares with other frameworks is, which names PyTorch
        for an "unless PyTorch is named" topic only when none of its own signs is there."""
        best: tuple[OutOfScopeTopic | None, float, list[str]] = (None, 0.0, [])
        best_margin = -math.inf
        for topic, signs in self.topics:
            if named and not topic.holds_when_named:
                continue
            if shared and topic.declines == "outweighs":
                continue  # a shared name still names PyTorch for the "when it outweighs" topics
            seen = sorted(((text, t) for text, t in signs if words.near(t)), key=lambda x: -len(x[1]))
            # a pattern sign is reported as the text it matched ("model.add(", "249/249 [=====] - ")
            seen += [(m.group(0)[:40], ("",)) for _, p in self.patterns[topic.topic] if (m := p.search(raw))]
            score = sum((1 + 0.5 * (len(t) - 1)) / (1 + i) for i, (_, t) in enumerate(seen))
            margin = score - OUTWEIGHS[topic.declines] * top
            if score > 0 and (margin, score) > (best_margin, best[1]):
                best, best_margin = (topic, round(score, 3), [text for text, _ in seen]), margin
        return best

    def _asks_for_help(self, query: str, vague: bool = False) -> bool:
        """A vague phrasing (`vague`), a request for help or review ("Help words") or a listed setup
        ("Setup words" next to numbers), while none of the post's questions names anything
        routable on its own ("porting my script to DDP, what needs to change?" is routable). After
        a vague complaint outside the clauses that ask, only those clauses count ("something is off
        with my DDP job, where do I start?")."""
        # "ok"/"okay" opening a sentence is a discourse marker ("ok this is driving me nuts"), not a judgment
        said = _Positions(_words(_TECHNICAL_YES_NO.sub(" ", _DISCOURSE.sub(r"\1", query))))
        asks = vague or any(said.near(h, gap=0) for h in self.help_words) or self._asks_review(query)
        if not asks and _setup_pairs(query, self.setup_words) < SETUP_MIN:
            return False
        return not self._asks_routable_question(query, asked_clause=vague and self._complains_vaguely(query))

    def _complains_vaguely(self, text: str) -> bool:
        """Whether `text` says a vague phrasing outside the clauses that ask ("it doesn't work, any
        advice?" complains; in "porting to DDP, what needs to change?" the phrasing is the question)."""
        told: list[str] = []
        for sentence in _SENTENCE.split(text):
            clauses = _clauses(sentence)
            told.extend(clauses[:-1] if _is_question(sentence) else clauses)
        return self._vague_ask(_Positions(terms("\n".join(told), self.synonyms, GLUE_WORDS))) is not None

    def _asks_routable_question(self, text: str, asked_clause: bool = False) -> bool:
        """Whether one of the question sentences of `text` names something routable on its own;
        with `asked_clause`, only the clause that asks counts, the last one of its sentence: in
        "torch.compile doesn't work on 2.5, any known issues?" the question names nothing. A first
        line that asks ("Checkpoints on google drive?") is a title: when a question of the body asks
        about its topic again (shares a term with it), the body's questions are read instead."""
        sentences = [s for s in _SENTENCE.split(text) if s.strip()]
        questions = []
        for i, sentence in enumerate(sentences):
            if not _is_question(sentence):
                continue
            ask = _clauses(sentence)[-1] if asked_clause else sentence
            if i and not set(terms(ask, self.synonyms, GLUE_WORDS)) - _ASKING - _ADDRESSED - _PRONOUN_ASK:
                ask = sentences[i - 1] + " " + ask  # "How can I do that?" asks about the sentence before
            questions.append((i, ask))
        title = text.strip().split("\n")[0].strip()
        if questions and questions[0][0] == 0 and sentences[0].strip() == title:
            asked = set(terms(title, self.synonyms, GLUE_WORDS)) - _ASKING - _ADDRESSED
            if any(asked & set(terms(q, self.synonyms, GLUE_WORDS)) for _, q in questions[1:]):
                questions = questions[1:]  # the body asks about the title's topic again, in its own words
        return any(self._names_routable(q) for _, q in questions[:MAX_QUESTIONS])

    def _names_routable(self, question: str) -> bool:
        """Whether one question sentence names something routable on its own. A question that asks
        for a review ("Could you sanity-check my FSDP setup?": a review word in it) names something
        only with a symptom: its topic words are what it wants reviewed."""
        asked = set(terms(question, self.synonyms, GLUE_WORDS)) - _ASKING - _ADDRESSED
        if asked and any(asked <= p for p in self.vague_term_sets):
            return False  # the question is one of the vague phrasings ("How can I optimize my model?")
        found = self._evidence(question)
        if max(found.scores.values(), default=0.0) < QUESTION_MIN:
            return False
        if not self._asks_review(question) or _TECHNICAL_YES_NO.search(question):
            return True  # "sanity check: is it ok to call X once per epoch?" asks about X, not for a review
        return max(found.symptom.values(), default=0.0) >= SYMPTOM_MIN

    def _bare_topic(self, query: str, qset: set[str]) -> bool:
        """Whether the post is only a name of what the user works with ("torch.compile", "FSDP2 bf16"):
        a few words, every term a topic term (a keyword, setup or topic word), nothing pasted."""
        return bool(qset) and len(tokens(query)) <= BARE_TOPIC_WORDS and qset <= self.topic_terms

    def _asks_review(self, text: str) -> bool:
        """Whether `text` asks for a review ("Review words": "review my", "sanity check")."""
        return self.review is not None and self.review.search(text.lower()) is not None

    def _vague_ask(self, loose: _Positions) -> str | None:
        """The question of the "Ask one question first" row whose phrasing the post says, if any."""
        best_q, best_len = None, 0
        for case, phrasings in self.vague_loose:
            for p in phrasings:
                if p and len(p) > best_len and loose.near(p, gap=1):
                    best_q, best_len = case.question, len(p)
        return best_q

    # -- the answer -----------------------------------------------------------------------------
    @staticmethod
    def read(query: str) -> str:
        """The post as every later step reads it: a long one cut to its head and tail, normalized."""
        return normalize(_truncate(query or ""))

    def features(self, posted: str) -> dict[str, float]:
        """What the two post models read of a post as `read` returns it: its terms and its first
        non-blank line's, and its character runs (`post_model.post_features`)."""
        title = next((line for line in posted.splitlines() if line.strip()), "")
        return post_features(terms(posted, self.synonyms), terms(title, self.synonyms), posted)

    def route(self, query: str, *, gate: bool = True) -> RouteResult:
        """Route one post (see the module docstring). With `gate=False`, the hand-written decline and
        clarify rules alone decide whether to route: what the gate model reads as their verdict."""
        posted = self.read(query)
        query, ignored = self._drop_not_evidence(posted)
        found = self._evidence(query)
        scores, evidence = found.scores, found.phrases
        qset = set(found.ordered)
        ranked = sorted(scores, key=lambda s: (-scores[s], s))
        top = scores[ranked[0]] if ranked else 0.0
        matched = {s: evidence[s] for s in ranked if evidence[s]}
        answer = {"scores": scores, "evidence": matched, "ignored_lines": ignored}

        # 1. decline: another framework's signs, or nothing about machine learning at all
        words = _Positions(_words(query))
        named = self._names_pytorch(words) or bool(found.pasted)
        topic, oos, signs = self._out_of_scope(words, named, top, self._names_shared(words), query)
        prose = _without_code(query)
        ask = self._vague_ask(_Positions(terms(query, self.synonyms, GLUE_WORDS))) or next(
            (question for question, pattern in self.ask_patterns if pattern.search(prose)), None
        )
        if topic is None and not named and ask is None and self._names_no_ml(posted, found):
            topic, oos, signs = OutOfScopeTopic(GENERIC_TOPIC, [], "outweighs", GENERIC_SAY, 0), 1.0, []
        # a symptom is PyTorch engineering: "explain why my training is slow" is not a theory question
        in_prose = self._evidence(prose) if prose != query else found
        symptom = max(in_prose.symptom.values())
        # a symptom told in the user's words, a phrase found in part ("RAM increases gradually",
        # "GPU 0 uses twice the memory of the others"), names a problem as well
        described = max(in_prose.described.values())
        if topic is not None and topic.declines == "outweighs" and symptom >= SYMPTOM_MIN:
            topic = None
        if topic is not None and oos >= OUTWEIGHS[topic.declines] * top:
            return RouteResult(
                status="out_of_scope",
                skills=[],
                out_of_scope=topic.topic,
                reason=topic.say,
                out_of_scope_signs=signs,
                confidence=_decline_confidence(oos, OUTWEIGHS[topic.declines] * top),
                summary=f"Out of scope ({topic.topic}): {topic.say}",
                **answer,
            )

        # 2. ask first: no symptom (in the prose: pasted code is context) and no concrete question
        question, vagueness = self._vague_question(qset, found.ordered)
        concrete = (
            symptom >= SYMPTOM_MIN
            or described >= SYMPTOM_MIN
            or self._names_api(prose, found.terms[ranked[0]])
        )
        vague = (
            (symptom < SYMPTOM_MIN and self._bare_topic(query, qset))
            # a request for the project's files names their topic, not a problem: it needs a symptom
            or (ask in self.project_request_asks and max(symptom, described) < SYMPTOM_MIN)
            or not concrete
            and (
                top < MIN_EVIDENCE
                # one keyword ("checkpoint", "pretrained") is a topic, unless a question asks about it
                # ("How to resume from an interrupted run?") and it is not a project's file
                or (
                    len(found.terms[ranked[0]]) < 2
                    and (
                        found.terms[ranked[0]] <= self.project_terms
                        or not self._asks_routable_question(prose)
                    )
                )
                or not evidence[ranked[0]]  # single words, no phrase
                or self._asks_for_help(prose, ask is not None)
                or (question is not None and vagueness >= 0.5 and top < 2 * MIN_EVIDENCE)
            )
        )
        features = self.features(posted)
        if vague and gate:
            # the rules would ask first: the gate model, learned from labelled posts with the rules'
            # verdict among its inputs, may find the post clearly routable instead
            vague = not gate_routes_asked_post(self.gate_model, features, scores, len(posted))
        if vague:
            return RouteResult(
                status="clarify",
                skills=[],
                clarify=ask or question or DEFAULT_QUESTION,
                confidence=0.0,
                summary="The post names no specific symptom; ask the question, then route on the answer.",
                **answer,
            )

        # 3. route: the post model's first skill (it weighs the post's words and the phrase scores,
        # learned from labelled real posts), then the other skills with FOLLOW_RATIO of the top score
        first, probability = self.post_model.rank(features, scores)[0]
        follow = [s for s in ranked if s != first and top > 0 and scores[s] >= FOLLOW_RATIO * top]
        order = [first, *follow][:3]
        confidence = round(probability, 2)
        tools = self.table.routes[first].tools
        summary = f"Start with {first}" + (f", then {', '.join(order[1:])}." if len(order) > 1 else ".")
        if tools:
            summary += f" Run {' / '.join(tools)} on the user's code first."
        if confidence < CLOSE_CALL and len(order) > 1:
            summary += (
                f" A close call with {order[1]} (confidence {confidence:.2f}): read both skills' "
                "descriptions and start with the one the user's words fit."
            )
        elif confidence < SURE and len(order) > 1:
            summary += (
                f" Likely, not sure (confidence {confidence:.2f}): if the user's words fit {order[1]} "
                "better, start there."
            )
        answer["evidence"] = {s: evidence[s] for s in order if evidence.get(s)}
        return RouteResult(
            status="routed",
            skills=order,
            tools=tools,
            confidence=confidence,
            summary=summary,
            **answer,
        )

    def _names_api(self, text: str, evidence: set[str]) -> bool:
        """Whether `text` names an API the skill's evidence holds: an identifier written as code
        (`torch.argmax`, `saved_tensors`, `clip_grad_norm_()`, a method call `x.permute(0, 2, 1)`)
        one of whose parts is an evidence term."""
        names = [
            tok
            for tok in tokens(text)
            if ("." in tok or "_" in tok) and "/" not in tok and not _NUMBER.match(tok)
        ]
        names += _METHOD_CALL.findall(text)
        return any(set(terms(name, self.synonyms)) & evidence for name in names)

    def _names_no_ml(self, posted: str, found: _Evidence) -> bool:
        """Whether a post is about no machine learning at all ("What is the capital of France?"): it
        is English (glue words), names no code identifier, shows none of the "ML words" and matches
        no route phrase fully."""
        words = _Positions(_words(posted))
        return (
            len(set(found.ordered)) >= 2
            and len(set(tokens(posted.lower())) & GLUE_WORDS)
            >= 2  # English: other languages get the question
            and max(found.symptom.values(), default=0.0) == 0.0
            and not found.whole
            and not any(words.near(w, gap=0) for w in (*self.ml_words, *self.anchors))  # the whole post
            and not any("." in t or "_" in t for t in tokens(posted) if not _NUMBER.match(t))  # code names
        )


_FENCE_LINE = re.compile(r"^\s*(```|~~~)")
_LOG_LINE = re.compile(
    r"Error\b|Exception\b|Traceback|Warning\b|warn\(|^\s*File \"|NCCL|out of memory|^\s*\[rank\d*\]|^\s*(?:INFO|WARNING|ERROR)\b"
)
_CODE_LINE = re.compile(
    r"^\s*(?:>>>|\.\.\.\s|def |class |import |from \S+ import |for .+ in .+:|while .+:|if .+:|elif .+:|else:|"
    r"return\b|with .+:|try:|except\b|@\w|[\w.\[\]'\"]+(?:\s*,\s*[\w.\[\]'\"]+)*\s*[-+*/]?=[^=]|"
    r"[\w.]+\(.*\)\s*$|[)\]}]+,?\s*$|#)"
)

# a progress bar's line (tqdm: "45%|####5     | 9/20 [00:03<00:04, 2.61it/s]") shows a rate, not a complaint
_PROGRESS_LINE = re.compile(r"\d+%\|[^|\n]*\|\s*\d+/\d+")


def _without_code(text: str) -> str:
    """The post without its pasted code: fenced blocks that hold no error or log line, and
    unfenced lines that read as Python statements. Error messages and logs stay: they are
    evidence. Returns `text` itself when nothing was code."""
    lines = text.splitlines()
    kept: list[str] = []
    block: list[str] | None = None
    for line in lines:
        if _FENCE_LINE.match(line):
            if block is None:
                block = []
            else:
                if any(_LOG_LINE.search(b) for b in block):
                    kept.extend(block)
                block = None
            continue
        if block is not None:
            block.append(line)
        elif not _CODE_LINE.match(line) or _LOG_LINE.search(line):
            kept.append(line)
    if block is not None:  # an unclosed fence: read what follows as text
        kept.extend(block)
    return text if len(kept) == len(lines) else "\n".join(kept)


def _is_pattern(sign: str) -> bool:
    """A sign written `/.../` is a regular expression on the raw post, not words."""
    return len(sign) > 2 and sign.startswith("/") and sign.endswith("/")


def _decline_confidence(signs: float, needed: float) -> float:
    """How clearly a query is out of scope: the signs' strength times their margin over what the
    topic needed (a topic that holds "unless PyTorch is named" needs nothing: a Keras question full
    of mixed-precision words is as clearly out of scope as a short one)."""
    strength = 1 - math.exp(-signs)
    margin = (signs - needed) / signs if signs > 0 else 0.0
    return round(strength * (0.5 + 0.5 * max(0.0, margin)), 2)


def _phrase_pattern(phrase: str) -> str:
    """A regex for a review phrase: its words in order, any run of spaces or hyphens between them."""
    return r"[\s\-]+".join(re.escape(w) for w in re.split(r"[\s\-]+", phrase.lower().strip()) if w)


_SETUP_TOKEN = re.compile(r"[A-Za-z_]+|\d[\w.+\-]*")


def _setup_pairs(text: str, setup_words: frozenset[str]) -> int:
    """How many setup words stand within two tokens of a number: 'batch 64', 'lr: 3e-4', '8 GPUs'."""
    toks = _SETUP_TOKEN.findall(text.lower())
    return sum(
        1
        for i, t in enumerate(toks)
        if t in setup_words and any(x[0].isdigit() for x in toks[max(0, i - 2) : i] + toks[i + 1 : i + 3])
    )


def _clauses(sentence: str) -> list[str]:
    """A sentence's clauses; the last one of a question is the one that asks."""
    return _CLAUSE.split(sentence.strip())


def _is_question(sentence: str) -> bool:
    """A sentence that asks: it ends with '?' or starts with an asking word ('how', 'should', ...)."""
    sentence = sentence.strip()
    first = re.sub(r"[^a-z]", "", sentence.split()[0].lower()) if sentence else ""
    return sentence.endswith("?") or first in _ASKING


# a Markdown emphasis underscore around a word (`_tf.stop_gradient(x)_`), not one inside a name
_EMPHASIS = re.compile(r"(?<!\w)_(?=[a-z])|(?<=[a-z0-9)])_(?!\w)")


_VERSIONED = re.compile(r"([a-z]{3,})\d+$")


def _words(text: str) -> list[str]:
    """Words for out-of-scope and PyTorch signs: lower-cased first (no CamelCase split), no stemming,
    glue words dropped; 'torch.cuda.is_available' -> [that, 'torch', 'cuda', 'is_available', 'available']."""
    out = []
    for tok in tokens(_EMPHASIS.sub(" ", text.lower())):
        if is_cjk(tok):
            continue  # signs are Latin words: a CJK character between two must not push them apart
        out.append(tok)
        if _NUMBER.match(tok):
            continue  # a version ('12.4') is one word: split, it would push a sign's words apart
        parts = [p for p in re.split(r"[./\-]", tok) if p]
        for part in parts if len(parts) > 1 else []:
            out.append(part)
            pieces = [p for p in part.split("_") if p]
            out.extend(pieces if len(pieces) > 1 else [])
        if len(parts) == 1 and "_" in tok:
            out.extend(p for p in tok.split("_") if p)
        # a name with its version run on ('tensorflow2.4.1', 'torch1.8') is the name too
        out.extend(m.group(1) for m in map(_VERSIONED.match, parts[:1]) if m)
    return [w for w in out if w not in GLUE_WORDS]


def _forms(word: str) -> tuple[str, ...]:
    """A sign word and its plurals: 'dictionary' -> ('dictionary', 'dictionarys', 'dictionaryes', 'dictionaries')."""
    return (word, word + "s", word + "es", *((word[:-1] + "ies",) if word.endswith("y") else ()))


class _Positions:
    """Where each word of a query stands, to find signs in order without rescanning the query.

    Use `_Positions(words).near(("install", "cuda"))`: the needle's words in order, each at most
    `gap` other words after the previous one; a word also matches its plural.
    """

    def __init__(self, words: list[str]):
        self._at: dict[str, list[int]] = {}
        for i, w in enumerate(words):
            self._at.setdefault(w, []).append(i)

    def of(self, word: str, forms: bool = True) -> list[int]:
        return sorted(i for form in (_forms(word) if forms else (word,)) for i in self._at.get(form, ()))

    def has(self, word: str, forms: bool = True) -> bool:
        return any(form in self._at for form in (_forms(word) if forms else (word,)))

    def near(self, needle: tuple[str, ...], gap: int = SIGN_GAP, forms: bool = True) -> bool:
        if not needle or not all(self.has(t, forms) for t in needle):
            return False
        following = [self.of(t, forms) for t in needle[1:]]
        for pos in self.of(needle[0], forms):
            for places in following:
                pos = next((j for j in places if pos < j <= pos + 1 + gap), -1)
                if pos < 0:
                    break
            else:
                return True
        return False


def _sequence_at(needle: tuple[str, ...], haystack: list[str], start: int, gap: int = SIGN_GAP) -> bool:
    """Whether needle's terms stand in haystack from `start` on, each at most `gap` terms after the last."""
    if haystack[start] != needle[0]:
        return False
    pos = start
    for t in needle[1:]:
        pos = next((j for j in range(pos + 1, min(pos + 2 + gap, len(haystack))) if haystack[j] == t), -1)
        if pos < 0:
            return False
    return True


def _in_order(needle: tuple[str, ...], haystack: list[str], gap: int = SIGN_GAP) -> bool:
    """Whether needle's terms appear in haystack in the same order, each at most `gap` other terms
    after the previous one: a message pasted word for word, not its words spread over a long log.
    Numbers are left out on both sides: they are the values a message was filled with."""
    return _Positions(_unnumbered(haystack)).near(tuple(_unnumbered(needle)), gap=gap, forms=False)


def _unnumbered(items: tuple[str, ...] | list[str]) -> list[str]:
    return [t for t in items if not _NUMBER.match(t)]
