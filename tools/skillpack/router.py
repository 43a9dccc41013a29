"""Parse the router skill (skills/using-pytorch-engineering/SKILL.md) into routing tables.

Use `table = parse_router(text)`; `route.Router(table)` does the routing. The router's
SKILL.md is the single source of routing knowledge, so its structure is a contract:

- `## Routes` holds one `### <skill-name>` section per specialist. Inside, labelled bullet lists:
  `**Symptoms**`, `**Error messages**`, `**Example queries**` (one phrase per bullet), an inline
  `**Keywords:** a, b, c` line, and a `**Tool:** \\`tool_name\\`` line naming the diagnostic
  tools to call (every backticked name on it).
- `## Precedence` is a table `| When the query mentions | together with | start with | then |`:
  comma-separated terms; `-` in "together with" means no second condition; "then" lists further
  skills (comma-separated, may be `-`).
- `## Common routing mistakes` is a table `| Symptom | Tempting first stop | Right first stop | Why |`;
  each row is a rule: symptom terms -> right first stop (the tempting one is not read).
- `## Ask one question first` is a table `| The query is only | Ask |`: vague phrasings and the
  one clarifying question to ask for them.
- `## Words users use` is a table `| Users write | Read it as |`: synonyms applied to the query.

Anything else in the file is prose for the agent and is ignored here. `RouterFormatError` names
the line that breaks the contract.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

LABELS = {
    "symptoms": "symptoms",
    "error messages": "errors",
    "errors": "errors",
    "example queries": "examples",
    "examples": "examples",
    "keywords": "keywords",
}


class RouterFormatError(ValueError):
    """The router SKILL.md does not follow the structure route() reads."""


@dataclass
class RouteSection:
    skill: str
    line: int
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


@dataclass
class RouterTable:
    routes: dict[str, RouteSection]
    precedence: list[PrecedenceRule]
    ambiguous: list[AmbiguousCase]
    synonyms: dict[str, str]  # user word/phrase -> canonical phrase

    def named_skills(self) -> set[str]:
        names = set(self.routes)
        for rule in self.precedence:
            names.add(rule.first)
            names.update(rule.then)
        return names


_HEADING = re.compile(r"^(#{2,3})\s+(.*?)\s*$")
_LABEL = re.compile(r"^\*\*([A-Za-z ]+?):?\*\*:?\s*(.*)$")
_TOOL = re.compile(r"`([a-z_]+)`")
_BULLET = re.compile(r"^\s*[-*]\s+(.*)$")


def _clean(cell: str) -> str:
    return cell.strip().strip("`").strip().strip('"').strip()


def _split_terms(cell: str) -> list[str]:
    cell = cell.strip()
    if cell in ("", "-", "—", "–", "(none)", "anything"):
        return []
    return [_clean(t) for t in cell.split(",") if _clean(t)]


def _table_rows(lines: list[tuple[int, str]]) -> list[tuple[int, list[str]]]:
    rows = []
    for lineno, line in lines:
        stripped = line.strip()
        if not stripped.startswith("|"):
            continue
        cells = [c.strip() for c in stripped.strip("|").split("|")]
        if all(re.fullmatch(r":?-{3,}:?", c) for c in cells if c):
            continue  # the separator row
        rows.append((lineno, cells))
    return rows[1:]  # drop the header row


def _sections(text: str) -> dict[str, list[tuple[int, str]]]:
    """Level-2 sections: title -> [(line number, line)], level-3 headings kept inside."""
    sections: dict[str, list[tuple[int, str]]] = {}
    current: list[tuple[int, str]] | None = None
    in_fence = False
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip().startswith("```"):
            in_fence = not in_fence
        m = _HEADING.match(line) if not in_fence else None
        if m and len(m.group(1)) == 2:
            current = sections.setdefault(m.group(2).strip().lower(), [])
            continue
        if current is not None:
            current.append((lineno, line))
    return sections


def _find(sections: dict[str, list[tuple[int, str]]], prefix: str) -> list[tuple[int, str]] | None:
    for title, lines in sections.items():
        if title.startswith(prefix):
            return lines
    return None


def _parse_routes(lines: list[tuple[int, str]]) -> dict[str, RouteSection]:
    routes: dict[str, RouteSection] = {}
    section: RouteSection | None = None
    label: str | None = None
    for lineno, line in lines:
        m = _HEADING.match(line)
        if m and len(m.group(1)) == 3:
            name = _clean(m.group(2))
            if name in routes:
                raise RouterFormatError(f"line {lineno}: skill {name!r} has two route sections")
            section = routes[name] = RouteSection(skill=name, line=lineno)
            label = None
            continue
        if section is None:
            continue
        lm = _LABEL.match(line.strip())
        if lm:
            key = lm.group(1).strip().lower()
            rest = lm.group(2).strip()
            if key == "tool":
                section.tools = _TOOL.findall(rest)
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
    return routes


def parse_router(text: str) -> RouterTable:
    """Parse the router's SKILL.md text; raise RouterFormatError when a required part is missing."""
    sections = _sections(text)
    route_lines = _find(sections, "routes")
    if route_lines is None:
        raise RouterFormatError(
            "no '## Routes' section: route() needs one '### <skill>' section per specialist"
        )
    routes = _parse_routes(route_lines)
    if not routes:
        raise RouterFormatError("'## Routes' has no '### <skill-name>' sections")
    for section in routes.values():
        if not any(section.phrases.values()):
            raise RouterFormatError(f"line {section.line}: route section {section.skill!r} lists no phrases")

    precedence: list[PrecedenceRule] = []
    for lineno, cells in _table_rows(_find(sections, "precedence") or []):
        if len(cells) < 4:
            raise RouterFormatError(
                f"line {lineno}: a precedence row needs 4 cells: mentions | together with | start with | then"
            )
        precedence.append(
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
    for lineno, cells in _table_rows(_find(sections, "common routing mistakes") or []):
        if len(cells) < 3:
            raise RouterFormatError(
                f"line {lineno}: a mistakes row needs: symptom | tempting first stop | right first stop | why"
            )
        precedence.append(
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

    ambiguous = [
        AmbiguousCase(phrasings=_split_terms(cells[0]), question=_clean(cells[1]), line=lineno)
        for lineno, cells in _table_rows(_find(sections, "ask one question") or [])
        if len(cells) >= 2
    ]
    synonyms: dict[str, str] = {}
    for _lineno, cells in _table_rows(_find(sections, "words users use") or []):
        if len(cells) >= 2:
            for word in _split_terms(cells[0]):
                synonyms[word.lower()] = _clean(cells[1]).lower()
    return RouterTable(routes, precedence, ambiguous, synonyms)
