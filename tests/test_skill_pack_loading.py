"""The skill pack on disk: manifests, digests and confined reads."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import get_args

import pytest

from torch_skills.results import SkillName
from torch_skills.skillpack.loader import (
    DEFAULT_SKILLS_DIR,
    ROUTER_NAME,
    SkillPack,
    SkillPathError,
    UnknownSkill,
)

SPECIALISTS = set(get_args(SkillName)) - {ROUTER_NAME}


@pytest.fixture()
def tiny_pack(tmp_path: Path) -> Path:
    skill = tmp_path / "skills" / "demo-skill"
    (skill / "references").mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: demo-skill\ndescription: A demo.\n---\n# Demo\n")
    (skill / "references" / "deep.md").write_text("# Deep\n")
    (tmp_path / "secret.txt").write_text("outside the skill")
    return tmp_path / "skills"


def test_the_router_and_all_eight_specialists_are_loaded():
    """Every skill folder of the project loads with its frontmatter."""
    pack = SkillPack.load(DEFAULT_SKILLS_DIR)
    assert set(pack.skills) == SPECIALISTS | {ROUTER_NAME}


def test_every_manifest_entry_matches_the_bytes_on_disk():
    """Digests and sizes in the Skills-extension entries are those of the files' raw bytes."""
    pack = SkillPack.load(DEFAULT_SKILLS_DIR)
    for name in pack.skills:
        entry = pack.entry(name)
        assert entry["uri"] == f"skill://{name}/SKILL.md"
        assert any(r["uri"] == entry["uri"] for r in entry["resources"])
        for resource in entry["resources"]:
            path = resource["uri"].removeprefix(f"skill://{name}/")
            data = pack.read(name, path)
            assert resource["size"] == len(data)
            assert resource["digest"] == "sha256:" + hashlib.sha256(data).hexdigest()


def test_reads_that_climb_out_of_the_skill_are_refused(tiny_pack: Path):
    """'..', absolute paths and backslashes never reach a file outside the skill."""
    pack = SkillPack.load(tiny_pack)
    for bad in ("../secret.txt", "references/../../secret.txt", "/etc/passwd", "..\\secret.txt", ""):
        with pytest.raises(SkillPathError):
            pack.read("demo-skill", bad)


def test_a_symlink_that_leads_outside_the_skill_is_neither_listed_nor_readable(tiny_pack: Path):
    """A link inside a skill pointing out of it is not part of the skill."""
    os.symlink(tiny_pack.parent / "secret.txt", tiny_pack / "demo-skill" / "leak.md")
    pack = SkillPack.load(tiny_pack)
    assert "leak.md" not in [f.path for f in pack.get("demo-skill").files]
    with pytest.raises(SkillPathError):
        pack.read("demo-skill", "leak.md")


def test_an_unknown_skill_names_the_skills_that_exist(tiny_pack: Path):
    """The error for a wrong name lists the right ones."""
    pack = SkillPack.load(tiny_pack)
    with pytest.raises(UnknownSkill, match="demo-skill"):
        pack.get("no-such-skill")


def test_a_missing_file_lists_the_files_of_the_skill(tiny_pack: Path):
    """The error for a wrong path inside a skill lists its files."""
    pack = SkillPack.load(tiny_pack)
    with pytest.raises(SkillPathError, match="references/deep.md"):
        pack.read("demo-skill", "references/missing.md")
