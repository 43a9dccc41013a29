"""Load the skills under `skills/`: frontmatter, file manifests with digests, safe file reads.

Use `pack = SkillPack.load(Path("skills"))`, then `pack.skills["debugging-techniques"]`,
`pack.read("debugging-techniques", "references/nan-search.md")` (bytes) and
`pack.entry(name)` (the Skills-extension `Skill` object as a dict). Reads are confined to the
skill's own folder: `..`, absolute paths, and symlinks that lead outside are refused with
`SkillPathError`, unknown skills with `UnknownSkill`.
"""

from __future__ import annotations

import hashlib
import mimetypes
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any


def _default_skills_dir() -> Path:
    """The skills shipped with the package: `torch_skills/skills/` installed, `skills/` in a clone
    (where the package is `tools/torch_skills/`)."""
    package_dir = Path(__file__).resolve().parents[1]
    installed = package_dir / "skills"
    return installed if installed.is_dir() else package_dir.parents[1] / "skills"


DEFAULT_SKILLS_DIR = _default_skills_dir()
ROUTER_NAME = "using-pytorch-engineering"
SKILL_FILE = "SKILL.md"


class UnknownSkill(KeyError):
    """No skill of that name is served."""

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])


class SkillPathError(ValueError):
    """A file path that is not a file inside the skill."""


class FrontmatterError(ValueError):
    """SKILL.md has no parseable YAML frontmatter."""


_PLAIN_LINE = re.compile(r"([A-Za-z][A-Za-z0-9_-]*):[ ]+([A-Za-z][^\t]*?)[ ]*")
_NOT_STRINGS = {"yes", "no", "true", "false", "on", "off", "null", "y", "n"}


def _plain_mapping(raw: str) -> dict[str, str] | None:
    """The frontmatter when every line is `key: text` that YAML reads as exactly that string, else None.

    Such a value is a one-line plain scalar: it starts with a letter (so it is no number, date,
    quote, block or other indicator), holds no ": " or " #" (a nested mapping or a comment) and is
    no YAML 1.1 boolean or null, and neither is its key. Anything else goes to the YAML parser
    (tests/test_frontmatter_fast_path.py compares the two)."""
    data: dict[str, str] = {}
    for line in raw.split("\n")[:-1] if raw.endswith("\n") else raw.split("\n"):
        match = _PLAIN_LINE.fullmatch(line)
        if match is None:
            return None
        key, value = match.groups()
        if (
            key in data
            or key.lower() in _NOT_STRINGS
            or value.lower() in _NOT_STRINGS
            or not value.isprintable()
            or ": " in value
            or " #" in value
            or value.endswith(":")
        ):
            return None
        data[key] = value
    return data or None


def split_frontmatter(text: str) -> tuple[dict[str, Any], str, int]:
    """(frontmatter dict, body, line number where the body starts) of a SKILL.md text."""
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        raise FrontmatterError("SKILL.md must start with a '---' line opening the YAML frontmatter")
    for i, line in enumerate(lines[1:], start=1):
        if line.strip() == "---":
            raw = "".join(lines[1:i])
            data = _plain_mapping(raw)
            if data is None:
                import yaml  # only for frontmatter beyond `key: plain text` lines (keeps start-up lean)

                try:
                    data = yaml.safe_load(raw) or {}
                except yaml.YAMLError as e:
                    raise FrontmatterError(f"frontmatter is not valid YAML: {e}") from e
            if not isinstance(data, dict):
                raise FrontmatterError("frontmatter must be a YAML mapping with name and description")
            return data, "".join(lines[i + 1 :]), i + 2
    raise FrontmatterError("frontmatter is not closed by a second '---' line")


def mime_type_for(path: str) -> str:
    if path.endswith(".md"):
        return "text/markdown"
    guessed, _ = mimetypes.guess_type(path)
    return guessed or "application/octet-stream"


@dataclass(frozen=True)
class SkillFile:
    path: str  # posix path relative to the skill folder
    size: int
    digest: str  # "sha256:<hex>"


@dataclass
class Skill:
    name: str
    folder: Path
    frontmatter: dict[str, Any]
    body: str
    files: list[SkillFile] = field(default_factory=list)

    @property
    def description(self) -> str:
        return str(self.frontmatter.get("description", ""))

    def uri(self, path: str = SKILL_FILE) -> str:
        return f"skill://{self.name}/{path}"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _inside(folder: Path, candidate: Path) -> bool:
    real_folder = Path(os.path.realpath(folder))
    real = Path(os.path.realpath(candidate))
    return real == real_folder or real.is_relative_to(real_folder)


def _list_files(folder: Path) -> list[SkillFile]:
    files = []
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or not _inside(folder, path):
            continue  # symlinks that lead outside the skill are not part of it
        rel = path.relative_to(folder).as_posix()
        if any(part.startswith(".") or part == "__pycache__" for part in rel.split("/")):
            continue
        data = path.read_bytes()
        files.append(SkillFile(rel, len(data), _digest(data)))
    return files


@dataclass
class SkillPack:
    root: Path
    skills: dict[str, Skill]

    @classmethod
    def load(cls, root: Path = DEFAULT_SKILLS_DIR) -> SkillPack:
        """Read every `<root>/<folder>/SKILL.md`. Folders whose SKILL.md is unreadable are skipped (see validate)."""
        skills: dict[str, Skill] = {}
        for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            skill_md = folder / SKILL_FILE
            if not skill_md.is_file():
                continue
            try:
                frontmatter, body, _ = split_frontmatter(skill_md.read_text(encoding="utf-8"))
            except (FrontmatterError, UnicodeDecodeError):
                continue
            name = str(frontmatter.get("name", folder.name))
            if name != folder.name:
                continue
            skills[name] = Skill(name, folder, frontmatter, body, _list_files(folder))
        return cls(root, skills)

    def get(self, name: str) -> Skill:
        try:
            return self.skills[name]
        except KeyError:
            known = ", ".join(self.skills)
            raise UnknownSkill(f"no skill named {name!r}; the skills are: {known}") from None

    def resolve(self, name: str, path: str) -> Path:
        """The real file behind `skill://<name>/<path>`, or SkillPathError / UnknownSkill."""
        skill = self.get(name)
        odd = next((c for c in path if not c.isprintable() or "\ud800" <= c <= "\udfff"), None)
        if odd is not None:  # NUL, newlines, control and undecodable characters name no skill file
            listing = ", ".join(f.path for f in skill.files)
            raise SkillPathError(
                f"{path!r} holds the character {odd!r}, which no skill file name has; "
                f"pass a plain relative path. The files of {name!r} are: {listing}"
            )
        pure = PurePosixPath(path)
        if not path or pure.is_absolute() or ".." in pure.parts or "\\" in path:
            raise SkillPathError(f"{path!r} is not a relative path inside the skill {name!r}")
        candidate = skill.folder.joinpath(*pure.parts)
        if not _inside(skill.folder, candidate):
            raise SkillPathError(f"{path!r} leads outside the skill {name!r}")
        try:
            found = candidate.is_file()
        except OSError:  # a name the file system refuses (over 255 bytes) names no skill file
            found = False
        if not found:
            listing = ", ".join(f.path for f in skill.files)
            raise SkillPathError(f"no file {path!r} in skill {name!r}; its files are: {listing}")
        return candidate

    def read(self, name: str, path: str = SKILL_FILE) -> bytes:
        return self.resolve(name, path).read_bytes()

    def entry(self, name: str) -> dict[str, Any]:
        """The Skills-extension `Skill` object: uri, verbatim frontmatter, complete file manifest."""
        skill = self.get(name)
        return {
            "uri": skill.uri(),
            "frontmatter": skill.frontmatter,
            "resources": [
                {"uri": skill.uri(f.path), "digest": f.digest, "size": f.size} for f in skill.files
            ],
        }

    def parse_uri(self, uri: str) -> tuple[str, str]:
        """('name', 'path') of a `skill://name/path` URI, or SkillPathError."""
        prefix = "skill://"
        if not uri.startswith(prefix):
            raise SkillPathError(f"{uri!r} is not a skill:// URI")
        name, _, path = uri[len(prefix) :].partition("/")
        if not name or not path:
            raise SkillPathError(
                f"{uri!r} must look like skill://<skill-name>/<file>, e.g. skill://{ROUTER_NAME}/SKILL.md"
            )
        return name, path
