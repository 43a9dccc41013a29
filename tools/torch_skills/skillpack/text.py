"""Text normalization shared by the router's index and the queries it routes.

`terms("GPU RAM keeps growing")` -> ['gpu', 'ram', 'keep', 'grow'] (lower-cased, light stemming,
stop words dropped); `Synonyms(table).apply(tokens)` rewrites user words into the router's terms.
Deterministic and dependency-free on purpose: routing must behave the same on every machine.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

STOP_WORDS = frozenset(
    """a an the and or but if then else of to in on at by for with without from into onto over under
    about after before during while when where which who whom what why how is are was were be been
    being am do does did doing done have has had having i me my mine we us our you your it its they
    them their this that these those there here can could should would will shall may might must not
    no yes so just also too very really quite any some all each every more most much many few other
    such only own same than again once up down out off get got getting gets use using used uses want
    need needs try tried trying please help thanks thank hi hello hey anyone someone something
    anything everything way ways thing things like im ive dont doesnt didnt cant wont isnt arent
    wasnt one two new still even now since because why whats hows lot lots bit pytorch torch model
    models training train trained code script issue issues problem problems question questions
    getting seem seems seemed keep keeps kept make makes made go goes going work works working
    worked run runs running ran see sees saw look looks looking know wrong correct properly right
    best good bad better through throughout""".split()
)

# Words kept although the stop list would drop them: they carry routing signal.
KEEP = frozenset({"out", "slow", "not", "no", "same", "save", "load", "stuck", "memory"})


STEM_LENGTH = 6  # truncation stemming: 'initialization', 'initialize' -> 'initia'


def stem(word: str) -> str:
    """Strip an inflection, then keep the first six letters: 'explodes', 'exploding' -> 'explod'.

    Truncation stemming is crude but predictable and needs no dictionary; the router's synonym
    table covers the few words it conflates or separates wrongly.
    """
    return uninflect(word)[:STEM_LENGTH] if word.isalpha() else word


@lru_cache(maxsize=1 << 16)  # every post's words go through it, several times per route
def uninflect(word: str) -> str:
    """`stem` without the truncation: 'released', 'releasing', 'releases' -> 'releas'; 'reproducible'
    stays apart from 'reproduce' ('reproduc')."""
    if len(word) <= 3 or not word.isalpha():
        return word
    for suffix, repl in (
        ("ies", "y"),
        ("sses", "ss"),
        ("ing", ""),
        ("edly", ""),
        ("ed", ""),
        ("es", "e"),
        ("s", ""),
    ):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            if suffix == "s" and word.endswith("ss"):
                break
            word = word[: len(word) - len(suffix)] + repl
            break
    if len(word) == 3 and word[0] not in _VOWELS and word[1] in _VOWELS and word[2] not in _VOWELS + "wxy":
        word += "e"  # 'timing' -> 'tim' -> 'time', the same stem as 'time'
    if word.endswith("e") and len(word) > 4:
        word = word[:-1]
    return word


_VOWELS = "aeiou"


_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
# Chinese, Japanese and Korean characters: written without spaces, so each one is a token and the
# "Words users use" table matches their runs ("不 下 降" -> "not learning"); unmatched ones are dropped
CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af"
_RAW_TOKEN = re.compile(rf"[A-Za-z0-9_]+(?:[./\-][A-Za-z0-9_]+)*|[{CJK}]")
_SCRIPT_BOUNDARY = re.compile(rf"(?<=[{CJK}])(?=[A-Za-z0-9])|(?<=[A-Za-z0-9])(?=[{CJK}])")


def normalize(text: str) -> str:
    """The post as the router reads it: full-width forms folded (NFKC: '？' -> '?', '，' -> ','),
    and a space where a Latin word and a CJK run touch ("loss一直" -> "loss 一直"), so that word
    boundaries in the router's patterns (negations, signs) see the Latin word."""
    return _SCRIPT_BOUNDARY.sub(" ", unicodedata.normalize("NFKC", text))


def is_cjk(token: str) -> bool:
    """Whether a token is one CJK character (see `tokens`)."""
    return len(token) == 1 and re.match(f"[{CJK}]", token) is not None


def _split_camel(word: str) -> str:
    """'ProcessGroupNCCL' -> 'Process-Group-NCCL'; 'NaN', 'ReLU', 'fp16' stay whole."""
    parts = _CAMEL.split(word)
    if len(parts) > 1 and (
        all(len(p) >= 3 for p in parts) or (len(parts) >= 3 and all(len(p) >= 2 for p in parts))
    ):
        return "-".join(parts)
    return word


def tokens(text: str) -> list[str]:
    """Lower-cased word tokens; compound tokens ('torch.cuda.amp', 'multi-gpu') are kept whole.

    CamelCase identifiers become hyphenated compounds first ('ProcessGroupNCCL' ->
    'process-group-nccl'), so their parts match like words. A CJK character is a token of its own.
    """
    text = text.replace("\u2019", "'").replace("'", "")
    out = []
    for raw in _RAW_TOKEN.findall(text):
        pieces = re.split(r"([./\-])", raw)
        out.append("".join(_split_camel(p) for p in pieces).lower())
    return out


def expand(token: str) -> list[str]:
    """A compound token and its parts: 'torch.cuda.amp' -> ['torch.cuda.amp', 'torch', 'cuda', 'amp']."""
    parts = [p for p in re.split(r"[./\-_]", token) if p]
    return [token, *parts] if len(parts) > 1 else [token]


# For the ask and decline rules, where "save model" must not read as every "save": only glue words go.
GLUE_WORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "is",
        "are",
        "was",
        "were",
        "be",
        "my",
        "our",
        "your",
        "its",
        "of",
        "to",
        "in",
        "on",
        "at",
        "for",
        "with",
        "by",
        "and",
        "or",
        "i",
        "it",
        "this",
        "that",
    ]
)


def terms(text: str, synonyms: Synonyms | None = None, stop_words: frozenset[str] = STOP_WORDS) -> list[str]:
    """Stemmed content terms of `text`, in order, compound tokens expanded."""
    toks = tokens(text)
    if synonyms is not None:
        toks = synonyms.apply(toks)
    out = []
    for tok in toks:
        if is_cjk(tok):
            continue  # a character no synonym read: no router term is written in it
        for piece in expand(tok):
            if piece in stop_words and piece not in KEEP:
                continue
            # a function word kept for the rules stays whole: stemmed, 'through' would read as 'throughput'
            out.append(piece if piece in STOP_WORDS and piece not in KEEP else stem(piece))
    return out


# Words a synonym's phrase matches with or without: "release the pretrained model" also reads
# "releasing a pretrained model" and "release pretrained models".
ARTICLES = frozenset({"a", "an", "the"})


class Synonyms:
    """Rewrites token sequences: {'gpu ram': 'memory', 'vram': 'memory'} (longest match first).

    A phrase of two or more words matches them inflected (`uninflect`: 'results', 'released') and
    with or without articles between them; a single word matches as written ('freezes' reads as
    'hangs', 'freeze' does not)."""

    def __init__(self, table: dict[str, str]):
        self._words: dict[str, list[str]] = {}  # one-word rules, as written
        self._phrases: dict[tuple[str, ...], list[str]] = {}  # longer rules, folded
        for src, dst in table.items():
            words = [tok for tok in _parts(tokens(src)) if tok not in ARTICLES]
            if len(words) == 1:
                self._words[words[0]] = tokens(dst)
            elif words:
                self._phrases[_folded(words)] = tokens(dst)
        self._longest = max((len(k) for k in self._phrases), default=0)

    def apply(self, toks: list[str]) -> list[str]:
        toks = _parts(toks)
        words = [i for i, tok in enumerate(toks) if tok not in ARTICLES]  # where each non-article is
        folded = _folded([toks[i] for i in words])
        out: list[str] = []
        done = 0  # the tokens before this one are in `out`
        w = 0
        while w < len(words):
            n, repl = 1, self._words.get(toks[words[w]])
            for longer in range(min(self._longest, len(words) - w), 1, -1):  # the longest phrase wins
                if (phrase := self._phrases.get(folded[w : w + longer])) is not None:
                    n, repl = longer, phrase
                    break
            if repl is not None:
                out.extend(toks[done : words[w]])
                out.extend(repl)
                done = words[w + n - 1] + 1
            w += n
        out.extend(toks[done:])
        return out


def _parts(toks: list[str]) -> list[str]:
    """Hyphenated compounds take part word by word ('gpu-util' matches the rule 'gpu util')."""
    return [part for tok in toks for part in (tok.split("-") if "-" in tok else [tok]) if part]


def _folded(toks: list[str]) -> tuple[str, ...]:
    return tuple(uninflect(tok) for tok in toks)
