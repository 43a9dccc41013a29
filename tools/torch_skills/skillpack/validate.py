"""Validate the skill pack: the Agent Skills rules plus this project's own.

Use `report = validate_pack(Path("skills"))`; `report.ok`, `report.problems` (each with file,
line and message), `report.render()`. `python server.py --check` prints the report and exits
non-zero on problems. Checks:

- every folder has a SKILL.md with YAML frontmatter; `name` equals the folder, kebab-case,
  at most 64 characters; `description` present, at most 1,024 characters, no `<` or `>`;
- the body of each SKILL.md is under 500 lines;
- every relative Markdown link resolves, case-sensitively, to a file inside the same skill;
- `references/` is one level deep, each reference is linked from SKILL.md, and a file over 300
  lines starts with a table of contents;
- the router parses (its SKILL.md with references/*.md), every skill it names exists, and every
  specialist is routed to;
- all descriptions together stay under 4,000 characters (clients cut longer skill listings).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from torch_skills.skillpack.loader import ROUTER_NAME, SKILL_FILE, FrontmatterError, split_frontmatter
from torch_skills.skillpack.router import RouterFormatError, load_router_table

MAX_NAME = 64
MAX_DESCRIPTION = 1024
MAX_BODY_LINES = 500
MAX_TOTAL_DESCRIPTIONS = 4000
TOC_AFTER_LINES = 300
_NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_LINK_RE = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_TOC_RE = re.compile(r"^#{1,3}\s+(table of )?contents\b", re.IGNORECASE)


@dataclass(frozen=True)
class Problem:
    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


@dataclass
class Report:
    problems: list[Problem] = field(default_factory=list)
    skills: list[str] = field(default_factory=list)
    description_chars: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, file: Path | str, line: int, message: str) -> None:
        self.problems.append(Problem(str(file), line, message))

    def render(self) -> str:
        head = (
            f"{len(self.skills)} skills, descriptions {self.description_chars}/{MAX_TOTAL_DESCRIPTIONS} characters: "
            + ("OK" if self.ok else f"{len(self.problems)} problem(s)")
        )
        return "\n".join([head, *(str(p) for p in self.problems)])


def _exists_case_sensitive(root: Path, rel: PurePosixPath) -> bool:
    current = root
    for part in rel.parts:
        if part in ("", "."):
            continue
        if part == ".." or not current.is_dir() or part not in {p.name for p in current.iterdir()}:
            return False
        current = current / part
    return current.is_file()


def _code_fence_lines(lines: list[str]) -> set[int]:
    inside, fenced = False, set()
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("```", "~~~")):
            inside = not inside
            fenced.add(i)
        elif inside:
            fenced.add(i)
    return fenced


def _check_links(report: Report, skill_dir: Path, md: Path, display: Path) -> set[str]:
    """Check relative links in one Markdown file; return the skill-relative targets it links to."""
    targets: set[str] = set()
    lines = md.read_text(encoding="utf-8").splitlines()
    fenced = _code_fence_lines(lines)
    for i, line in enumerate(lines):
        if i in fenced:
            continue
        for m in _LINK_RE.finditer(line):
            href = m.group(1).split("#", 1)[0]
            if not href or re.match(r"^[a-z][a-z0-9+.-]*:", href):  # URLs, mailto:, skill:// ...
                continue
            rel = PurePosixPath(md.parent.relative_to(skill_dir).as_posix()) / href
            normalized = PurePosixPath(*[p for p in rel.parts if p != "."])
            if href.startswith("/") or ".." in PurePosixPath(href).parts:
                report.add(
                    display, i + 1, f"link {href!r} leaves the skill; name other skills in backticks instead"
                )
            elif not _exists_case_sensitive(skill_dir, normalized):
                report.add(display, i + 1, f"link {href!r} does not resolve (paths are case-sensitive)")
            else:
                targets.add(normalized.as_posix())
    return targets


def validate_skill(report: Report, skill_dir: Path, base: Path) -> dict | None:
    """Check one skill folder; return its frontmatter when it parses."""
    skill_md = skill_dir / SKILL_FILE
    display = skill_md.relative_to(base.parent) if skill_md.is_relative_to(base.parent) else skill_md
    if not skill_md.is_file():
        report.add(skill_dir, 0, "no SKILL.md in this skill folder")
        return None
    text = skill_md.read_text(encoding="utf-8")
    try:
        frontmatter, body, body_start = split_frontmatter(text)
    except FrontmatterError as e:
        report.add(display, 1, str(e))
        return None
    name = frontmatter.get("name")
    if not isinstance(name, str) or not name:
        report.add(display, 2, "frontmatter needs a `name`")
    else:
        if name != skill_dir.name:
            report.add(display, 2, f"name {name!r} must equal the folder name {skill_dir.name!r}")
        if len(name) > MAX_NAME or not _NAME_RE.match(name):
            report.add(
                display,
                2,
                f"name {name!r} must be kebab-case (a-z, 0-9, single hyphens), at most {MAX_NAME} chars",
            )
    description = frontmatter.get("description")
    if not isinstance(description, str) or not description.strip():
        report.add(
            display,
            2,
            "frontmatter needs a non-empty `description` saying what the skill does and when to use it",
        )
    else:
        if len(description) > MAX_DESCRIPTION:
            report.add(
                display, 2, f"description has {len(description)} characters; the limit is {MAX_DESCRIPTION}"
            )
        if "<" in description or ">" in description:
            report.add(display, 2, "description must not contain '<' or '>'")
    body_lines = body.count("\n") + (0 if body.endswith("\n") or not body else 1)
    if body_lines >= MAX_BODY_LINES:
        report.add(
            display,
            body_start,
            f"body has {body_lines} lines; keep it under {MAX_BODY_LINES} and move depth to references/",
        )

    linked = set()
    for md in sorted(skill_dir.rglob("*.md")):
        shown = md.relative_to(base.parent) if md.is_relative_to(base.parent) else md
        targets = _check_links(report, skill_dir, md, shown)
        if md == skill_md:
            linked = targets
    refs = skill_dir / "references"
    if refs.is_dir():
        for path in sorted(refs.rglob("*")):
            shown = path.relative_to(base.parent) if path.is_relative_to(base.parent) else path
            if path.is_dir():
                report.add(shown, 0, "references/ must be one level deep (no sub-folders)")
                continue
            rel = path.relative_to(skill_dir).as_posix()
            if path.suffix == ".md":
                if rel not in linked:
                    report.add(
                        shown, 0, f"{rel} is not linked from SKILL.md; link it with 'read {rel} when ...'"
                    )
                lines = path.read_text(encoding="utf-8").splitlines()
                if len(lines) > TOC_AFTER_LINES and not any(_TOC_RE.match(x) for x in lines[:40]):
                    report.add(
                        shown,
                        1,
                        f"{len(lines)} lines: files over {TOC_AFTER_LINES} lines start with a '## Contents' table of contents",
                    )
    return frontmatter


def validate_pack(root: Path) -> Report:
    """Validate every skill under `root` and the router's routing tables."""
    report = Report()
    if not root.is_dir():
        report.add(root, 0, "skills folder not found")
        return report
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    names: set[str] = set()
    for folder in folders:
        frontmatter = validate_skill(report, folder, root)
        if frontmatter is not None:
            names.add(folder.name)
            report.skills.append(folder.name)
            report.description_chars += len(str(frontmatter.get("description", "")))
    if report.description_chars > MAX_TOTAL_DESCRIPTIONS:
        report.add(
            root,
            0,
            f"the descriptions total {report.description_chars} characters; keep all of them under {MAX_TOTAL_DESCRIPTIONS}",
        )
    router_md = root / ROUTER_NAME / SKILL_FILE
    if not router_md.is_file():
        report.add(root / ROUTER_NAME, 0, "the router skill is missing")
        return report
    shown = router_md.relative_to(root.parent)
    try:
        table = load_router_table(root / ROUTER_NAME)
    except (RouterFormatError, FrontmatterError) as e:
        report.add(shown, 0, f"route() cannot parse the router: {e}")
        return report
    for skill in sorted(table.named_skills() - names):
        line = next((r.line for r in table.precedence if skill in (r.first, *r.then)), 0)
        line = table.routes[skill].line if skill in table.routes else line
        report.add(shown, line, f"the router names {skill!r}, which is not a skill folder")
    for skill in sorted(names - set(table.routes) - {ROUTER_NAME}):
        report.add(shown, 0, f"no '### {skill}' route section: the router never sends anyone to {skill!r}")
    return report
