r"""Parse the router skill (skills/using-pytorch-engineering/) into routing tables.

Use `table = parse_router(skill_md_body, references={"references/routing-terms.md": text})`, or
`load_router_table(folder)` for a skill folder on disk; `route.Router(table)` does the routing.
The router's SKILL.md and its references/ files are the single source of routing knowledge, so
their structure is a contract. Level-2 sections are looked up by title in any of those files
(a title used in two files is one section, the SKILL.md lines first):

- `## Start here` is a table `| The user reports or asks | Skill | Run first |`: one row per
  specialist, the skill in backticks, the diagnostic tools to call in backticks in the last cell
  (none named: read the skill). It is what a reader sees first, and where the tools come from.
- `## Routes` (kept in references/ so it does not bury the rules) holds one `### <skill-name>`
  section per specialist. Inside, labelled bullet lists: `**Symptoms**`, `**Error messages**`,
  `**Example queries**` (one phrase per bullet), and an inline `**Keywords:** a, b, c` line.
  Without a `## Routes` section the table has tools but no phrases (enough to list the tools;
  `route.Router` refuses it).
- `## Precedence` is a table `| When the query mentions | together with | start with | then |`:
  comma-separated terms; `-` in "together with" means no second condition; "then" lists further
  skills (comma-separated, may be `-`).
- `## Common routing mistakes` is a table `| Symptom | Tempting first stop | Right first stop | Why |`;
  each row is parsed as a rule (symptom terms -> right first stop; the tempting one is not read)
  so that its skill names are validated, but `route.Router` reorders only by `## Precedence`.
- `## Ask one question first` is a table `| The post says only | Ask |`: vague phrasings and the
  one clarifying question to ask for them (route() asks it when a post says one of them and
  names no symptom, however much detail it carries; a phrasing written `/.../` is a regular
  expression on the post's prose, without its code), a `**Help words:** a, b` line (words of a
  request for help or review) and a `**Setup words:** a, b` line (hyper-parameter and hardware
  words that, next to a number, list a setup): either makes a symptomless post without a routable
  question vague. A `**Review words:** a, b` line holds phrases, small words kept ("review my",
  "sanity check"), of a request for a review or of a question to a project's authors about their
  own work ("your repository", "as the paper"): a question that says one names nothing routable
  without a symptom (its topic words are what it wants reviewed or told). A `**Topic words:** a, b` line
  holds words that name a setup, not a problem ("setup", "config"): with every skill's keywords
  and the setup words, a phrase matched only on them names no symptom.
- `## Words users use` is a table `| Users write | Read it as |`: synonyms applied to the query.
- `## Out of scope` is a table `| Topic | The query mentions | Declines | Say |`: signs of a
  question that is not PyTorch engineering, when the row holds (`unless PyTorch is named`,
  `when it outweighs` the skills' evidence, or `always` when it outweighs, PyTorch named or not),
  and the reason to give. A `**PyTorch signs:** a, b` line in that section lists the words that
  name PyTorch; a `**Shared API names:** a, b` line, names other frameworks use too, which name
  PyTorch for an `unless PyTorch is named` row only when none of that row's signs is there.
  The `**ML words:**` line of that section lists words of machine learning at all: a question
  that shows none of them, no PyTorch sign and no route phrase is declined as not ML. A row whose
  "Declines" cell says `on sight` declines on any one sign, PyTorch named or not: code or log text
  only another framework writes. A row's signs may be regular expressions written `/.../`,
  matched case-sensitively on the raw post (a Keras progress bar: `/\d+/\d+ \[=+/`; words apart,
  "loss function" ... "paper", for a theory question).
- `## Not evidence` is a table `| Lines starting with | Are |`: line prefixes (a pasted
  `collect_env` dump, issue-template headings) that route() drops before reading the query.

Anything else in the file is prose for the agent and is ignored here. `RouterFormatError` names
the line that breaks the contract.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from torch_skills.skillpack.loader import split_frontmatter

LABELS = {
    "symptoms": "symptoms",
    "error messages": "errors",
    "errors": "errors",
    "example queries": "examples",
    "examples": "examples",
    "keywords": "keywords",
}


ROUTER_SKILL_FILE = "SKILL.md"


class RouterFormatError(ValueError):
    """The router SKILL.md does not follow the structure route() reads."""


@dataclass
class RouteSection:
    skill: str
    line: int
    file: str = ROUTER_SKILL_FILE
    tools: list[str] = field(default_factory=list)
    phrases: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in set(LABELS.values())})

    def all_phrases(self) -> list[tuple[str, str]]:
        return [(kind, p) for kind, items in self.phrases.items() for p in items]


@dataclass
class PrecedenceRule:
    terms: list[str]
    together_with: list[str]  # empty: no second condition
    first: str
    then: list[str]
    line: int
    source: str  # "precedence" or "mistakes"
    why: str = ""


@dataclass
class AmbiguousCase:
    phrasings: list[str]
    question: str
    line: int


DECLINES = ("unless", "outweighs", "always", "on sight")  # the keyword of each "Declines" value


@dataclass
class OutOfScopeTopic:
    topic: str
    signs: list[str]
    # "unless" PyTorch is named, when it "outweighs" the skills, "always" (if it outweighs), "on sight"
    declines: str
    say: str
    line: int

    @property
    def holds_when_named(self) -> bool:
        return self.declines in ("always", "on sight")


@dataclass
class RouterTable:
    routes: dict[str, RouteSection]
    precedence: list[PrecedenceRule]
    ambiguous: list[AmbiguousCase]
    synonyms: dict[str, str]  # user word/phrase -> canonical phrase
    out_of_scope: list[OutOfScopeTopic] = field(default_factory=list)
    pytorch_signs: list[str] = field(default_factory=list)
    not_evidence: list[str] = field(default_factory=list)  # line prefixes, lower-cased
    help_words: list[str] = field(default_factory=list)  # "Help words:" of "Ask one question first"
    setup_words: list[str] = field(default_factory=list)  # "Setup words:" of "Ask one question first"
    topic_words: list[str] = field(default_factory=list)  # "Topic words:" of "Ask one question first"
    review_words: list[str] = field(default_factory=list)  # "Review words:" of "Ask one question first"
    # "Shared API names:" PyTorch names other frameworks use too (Flax's nn.Module): they name
    # PyTorch for a topic that declines "unless PyTorch is named" only when they are all there is
    shared_signs: list[str] = field(default_factory=list)
    ml_words: list[str] = field(default_factory=list)  # "ML words:" of "Out of scope"

    def named_skills(self) -> set[str]:
        names = set(self.routes)
        for rule in self.precedence:
            names.add(rule.first)
            names.update(rule.then)
        return names


_CELL_BAR = re.compile(r"(?<!\\)\|")
_HEADING = re.compile(r"^(#{2,3})\s+(.*?)\s*$")
_LABEL = re.compile(r"^\*\*([A-Za-z ]+?):?\*\*:?\s*(.*)$")
_TOOL = re.compile(r"`([a-z_]+)`")
_SKILL = re.compile(r"`([a-z0-9]+(?:-[a-z0-9]+)+)`")
_BULLET = re.compile(r"^\s*[-*]\s+(.*)$")

# A line of a router file: (file, line number, text). Messages say "line N" for SKILL.md and
# "references/x.md line N" for the others.
Line = tuple[str, int, str]


def _where(file: str, lineno: int) -> str:
    return f"line {lineno}" if file == ROUTER_SKILL_FILE else f"{file} line {lineno}"


def _clean(cell: str) -> str:
    return cell.strip().strip("`").strip().strip('"').strip()


def _split_terms(cell: str) -> list[str]:
    cell = cell.strip()
    if cell in ("", "-", "—", "–", "(none)", "anything"):
        return []
    return [_clean(t) for t in cell.split(",") if _clean(t)]


def _table_rows(lines: list[Line]) -> list[tuple[str, int, list[str]]]:
    """Rows of every table in `lines` (each table's header row dropped)."""
    rows: list[tuple[str, int, list[str]]] = []
    in_table = False
    for file, lineno, line in lines:
        stripped = line.strip()
        if not stripped.startswith("|"):
            in_table = False
            continue
        # a cell may hold "|" escaped as "\\|" (a regular-expression sign), as Markdown tables allow
        cells = [c.strip().replace("\\|", "|") for c in _CELL_BAR.split(stripped.strip("|"))]
        if not in_table:
            in_table = True  # the header row
            continue
        if all(re.fullmatch(r":?-{3,}:?", c) for c in cells if c):
            continue  # the separator row
        rows.append((file, lineno, cells))
    return rows


def _sections(files: dict[str, str]) -> dict[str, list[Line]]:
    """Level-2 sections of all files: title -> [(file, line number, line)], level-3 headings kept."""
    sections: dict[str, list[Line]] = {}
    for file, text in files.items():
        current: list[Line] | None = None
        in_fence = False
        for lineno, line in enumerate(text.splitlines(), start=1):
            if line.strip().startswith("```"):
                in_fence = not in_fence
            m = _HEADING.match(line) if not in_fence else None
            if m and len(m.group(1)) == 2:
                current = sections.setdefault(m.group(2).strip().lower(), [])
                continue
            if current is not None:
                current.append((file, lineno, line))
    return sections


def _find(sections: dict[str, list[Line]], prefix: str) -> list[Line] | None:
    for title, lines in sections.items():
        if title.startswith(prefix):
            return lines
    return None


def _parse_start_here(lines: list[Line]) -> dict[str, RouteSection]:
    routes: dict[str, RouteSection] = {}
    for file, lineno, cells in _table_rows(lines):
        skills = _SKILL.findall(cells[1]) if len(cells) >= 3 else []
        if len(skills) != 1:
            raise RouterFormatError(
                f"{_where(file, lineno)}: a 'Start here' row needs 3 cells: "
                "what the user reports | `skill-name` | `tool` to run first (or 'none')"
            )
        name = skills[0]
        if name in routes:
            raise RouterFormatError(f"{_where(file, lineno)}: skill {name!r} has two 'Start here' rows")
        routes[name] = RouteSection(skill=name, line=lineno, file=file, tools=_TOOL.findall(cells[-1]))
    return routes


def _parse_routes(lines: list[Line], routes: dict[str, RouteSection]) -> None:
    section: RouteSection | None = None
    label: str | None = None
    seen: set[str] = set()
    for file, lineno, line in lines:
        m = _HEADING.match(line)
        if m and len(m.group(1)) == 3:
            name = _clean(m.group(2))
            if name in seen:
                raise RouterFormatError(f"{_where(file, lineno)}: skill {name!r} has two route sections")
            seen.add(name)
            if name not in routes:
                raise RouterFormatError(
                    f"{_where(file, lineno)}: route section {name!r} has no row in the 'Start here' table"
                )
            section = routes[name]
            label = None
            continue
        if section is None:
            continue
        lm = _LABEL.match(line.strip())
        if lm:
            key = lm.group(1).strip().lower()
            rest = lm.group(2).strip()
            if key == "tool":
                section.tools = section.tools or _TOOL.findall(rest)
                label = None
            elif key in LABELS:
                label = LABELS[key]
                if rest:  # the inline form: **Keywords:** a, b, c
                    section.phrases[label] += _split_terms(rest)
                    label = None
            else:
                label = None
            continue
        bm = _BULLET.match(line)
        if bm and label is not None:
            phrase = _clean(bm.group(1))
            if phrase:
                section.phrases[label].append(phrase)
        elif line.strip() and not bm:
            label = None if not line.startswith(" ") else label
    for section in routes.values():
        if not any(section.phrases.values()):
            raise RouterFormatError(
                f"{_where(section.file, section.line)}: skill {section.skill!r} has no route section "
                "with phrases under '## Routes'"
            )


def _parse_rules(sections: dict[str, list[Line]]) -> list[PrecedenceRule]:
    rules: list[PrecedenceRule] = []
    for file, lineno, cells in _table_rows(_find(sections, "precedence") or []):
        if len(cells) < 4:
            raise RouterFormatError(
                f"{_where(file, lineno)}: a precedence row needs 4 cells: mentions | together with | start with | then"
            )
        rules.append(
            PrecedenceRule(
                terms=_split_terms(cells[0]),
                together_with=_split_terms(cells[1]),
                first=_clean(cells[2]),
                then=_split_terms(cells[3]),
                line=lineno,
                source="precedence",
                why=cells[4].strip() if len(cells) > 4 else "",
            )
        )
    for file, lineno, cells in _table_rows(_find(sections, "common routing mistakes") or []):
        if len(cells) < 3:
            raise RouterFormatError(
                f"{_where(file, lineno)}: a mistakes row needs: symptom | tempting first stop | right first stop | why"
            )
        rules.append(
            PrecedenceRule(
                terms=_split_terms(cells[0]),
                together_with=[],
                first=_clean(cells[2]),
                then=[],
                line=lineno,
                source="mistakes",
                why=cells[3].strip() if len(cells) > 3 else "",
            )
        )
    return rules


def _parse_out_of_scope(
    lines: list[Line],
) -> tuple[list[OutOfScopeTopic], list[str], list[str], list[str]]:
    topics: list[OutOfScopeTopic] = []
    for file, lineno, cells in _table_rows(lines):
        declines = [k for k in DECLINES if len(cells) >= 4 and k in cells[2].lower()]
        if len(cells) < 4 or len(declines) != 1:
            raise RouterFormatError(
                f"{_where(file, lineno)}: an out-of-scope row needs 4 cells: topic | signs (comma-separated) | "
                "declines (unless PyTorch is named / when it outweighs / always / on sight) | what to say"
            )
        topics.append(
            OutOfScopeTopic(
                topic=_clean(cells[0]),
                signs=_split_terms(cells[1]),
                declines=declines[0],
                say=cells[3].strip(),
                line=lineno,
            )
        )
    lists: dict[str, list[str]] = {"pytorch signs": [], "shared api names": [], "ml words": []}
    for _file, _lineno, line in lines:
        lm = _LABEL.match(line.strip())
        if lm and lm.group(1).strip().lower() in lists:
            lists[lm.group(1).strip().lower()] += _split_terms(lm.group(2))
    return topics, lists["pytorch signs"], lists["shared api names"], lists["ml words"]


def parse_router(text: str, references: dict[str, str] | None = None) -> RouterTable:
    """Parse the router's SKILL.md body (and its references/ files, path -> text).

    Raises RouterFormatError when a required part is missing or a row is malformed.
    """
    sections = _sections({ROUTER_SKILL_FILE: text, **(references or {})})
    start = _find(sections, "start here")
    if start is None:
        raise RouterFormatError(
            "no '## Start here' section: route() needs its table of `skill` | `tool` rows, one per specialist"
        )
    routes = _parse_start_here(start)
    if not routes:
        raise RouterFormatError("'## Start here' has no rows naming a `skill-name`")
    route_lines = _find(sections, "routes")
    if route_lines is not None:
        _parse_routes(route_lines, routes)

    ambiguous = [
        AmbiguousCase(phrasings=_split_terms(cells[0]), question=_clean(cells[1]), line=lineno)
        for _file, lineno, cells in _table_rows(_find(sections, "ask one question") or [])
        if len(cells) >= 2
    ]
    synonyms: dict[str, str] = {}
    for _file, _lineno, cells in _table_rows(_find(sections, "words users use") or []):
        if len(cells) >= 2:
            for word in _split_terms(cells[0]):
                synonyms[word.lower()] = _clean(cells[1]).lower()
    topics, signs, shared, ml_words = _parse_out_of_scope(_find(sections, "out of scope") or [])
    ask_section = _find(sections, "ask one question") or []
    help_words, setup_words, topic_words, review_words = (
        [
            word.lower()
            for _file, _lineno, line in ask_section
            if (lm := _LABEL.match(line.strip())) and lm.group(1).strip().lower() == label
            for word in _split_terms(lm.group(2))
        ]
        for label in ("help words", "setup words", "topic words", "review words")
    )
    not_evidence = [
        prefix.lower()
        for _file, _lineno, cells in _table_rows(_find(sections, "not evidence") or [])
        for prefix in _split_terms(cells[0])
    ]
    return RouterTable(
        routes,
        _parse_rules(sections),
        ambiguous,
        synonyms,
        topics,
        signs,
        not_evidence,
        help_words,
        setup_words,
        topic_words,
        review_words,
        shared,
        ml_words,
    )


def router_references(folder: Path) -> dict[str, str]:
    """The router skill's references/*.md files on disk, as parse_router() takes them."""
    refs = folder / "references"
    if not refs.is_dir():
        return {}
    return {
        f"references/{p.name}": p.read_text(encoding="utf-8")
        for p in sorted(refs.glob("*.md"))
        if p.is_file()
    }


def load_router_table(folder: Path) -> RouterTable:
    """Parse the router skill in `folder` (its SKILL.md body and references/*.md)."""
    text = (folder / ROUTER_SKILL_FILE).read_text(encoding="utf-8")
    _frontmatter, body, _start = split_frontmatter(text)
    return parse_router(body, router_references(folder))
