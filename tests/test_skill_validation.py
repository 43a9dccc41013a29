"""`python server.py --check`: the validator finds each kind of broken skill, with file and line."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR
from torch_skills.skillpack.validate import validate_pack

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def pack_copy(tmp_path: Path) -> Path:
    target = tmp_path / "skills"
    shutil.copytree(DEFAULT_SKILLS_DIR, target)
    return target


def _messages(root: Path) -> list[str]:
    return [str(p) for p in validate_pack(root).problems]


def test_the_project_skills_pass_the_validator():
    """The shipped skill pack has no problems."""
    report = validate_pack(DEFAULT_SKILLS_DIR)
    assert report.ok, report.render()
    assert len(report.skills) == 9


def test_the_check_flag_exits_zero_on_the_shipped_pack_and_non_zero_on_a_broken_one(pack_copy: Path):
    """`server.py --check` is usable in CI."""
    ok = subprocess.run([sys.executable, "server.py", "--check"], cwd=REPO, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    (pack_copy / "debugging-techniques" / "SKILL.md").write_text("no frontmatter\n")
    bad = subprocess.run(
        [sys.executable, "server.py", "--check", "--skills-dir", str(pack_copy)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1
    assert "debugging-techniques/SKILL.md:1" in bad.stdout


def test_a_name_that_differs_from_its_folder_is_reported_at_its_line(pack_copy: Path):
    """The frontmatter name must equal the folder name."""
    md = pack_copy / "performance-profiling" / "SKILL.md"
    md.write_text(md.read_text().replace("name: performance-profiling", "name: Performance_Profiling", 1))
    found = _messages(pack_copy)
    assert any("performance-profiling/SKILL.md:2" in m and "must equal the folder" in m for m in found)
    assert any("kebab-case" in m for m in found)


def test_a_long_description_or_one_with_angle_brackets_is_reported(pack_copy: Path):
    """Descriptions stay within the spec: 1,024 characters, no '<' or '>'."""
    md = pack_copy / "module-design-patterns" / "SKILL.md"
    text = md.read_text()
    start = text.index("description:")
    end = text.index("\n", start)
    md.write_text(text[:start] + "description: use <this> " + "x" * 1100 + text[end:])
    found = _messages(pack_copy)
    assert any("characters; the limit is 1024" in m for m in found)
    assert any("must not contain '<' or '>'" in m for m in found)


def test_descriptions_that_together_pass_4000_characters_are_reported(pack_copy: Path):
    """Clients cut skill listings past a budget, so the nine descriptions share 4,000 characters."""
    for md in pack_copy.glob("*/SKILL.md"):
        text = md.read_text()
        start = text.index("description:")
        end = text.index("\n", start)
        md.write_text(text[:start] + "description: " + "word " * 100 + text[end:])
    assert any("descriptions total" in m for m in _messages(pack_copy))


def test_a_broken_or_wrong_case_link_is_reported_with_its_line(pack_copy: Path):
    """Links resolve case-sensitively inside the skill."""
    md = pack_copy / "debugging-techniques" / "SKILL.md"
    text = md.read_text() + "\nRead [the forms](references/FORMS.md) when filling forms.\n"
    md.write_text(text)
    (pack_copy / "debugging-techniques" / "references").mkdir(exist_ok=True)
    (pack_copy / "debugging-techniques" / "references" / "forms.md").write_text("# forms\n")
    line = text.count("\n")
    assert any(
        f"debugging-techniques/SKILL.md:{line}" in m and "does not resolve" in m for m in _messages(pack_copy)
    )


def test_a_link_to_another_skill_folder_is_reported(pack_copy: Path):
    """Cross-skill links do not resolve as skill:// resources; name the skill instead."""
    md = pack_copy / "debugging-techniques" / "SKILL.md"
    md.write_text(md.read_text() + "\nSee [memory](../tensor-operations-and-memory/SKILL.md).\n")
    assert any("leaves the skill" in m for m in _messages(pack_copy))


def test_an_unlinked_reference_and_a_long_one_without_contents_are_reported(pack_copy: Path):
    """Every reference is linked from SKILL.md; files over 300 lines start with a table of contents."""
    refs = pack_copy / "custom-autograd-functions" / "references"
    refs.mkdir(exist_ok=True)
    (refs / "orphan-long.md").write_text("# Orphan\n" + "line\n" * 320)
    found = _messages(pack_copy)
    assert any("orphan-long.md is not linked from SKILL.md" in m for m in found)
    assert any("orphan-long.md:1" in m and "table of contents" in m for m in found)


def test_a_body_of_500_lines_is_reported(pack_copy: Path):
    """SKILL.md bodies stay under 500 lines."""
    md = pack_copy / "checkpointing-and-reproducibility" / "SKILL.md"
    md.write_text(md.read_text() + "filler\n" * 500)
    assert any("keep it under 500" in m for m in _messages(pack_copy))


def test_a_router_that_names_a_missing_skill_is_reported(pack_copy: Path):
    """Every skill the router names must exist, and every specialist must be routed to."""
    shutil.rmtree(pack_copy / "custom-autograd-functions")
    found = _messages(pack_copy)
    assert any("names 'custom-autograd-functions', which is not a skill folder" in m for m in found)


def _drop_custom_autograd_route(pack_copy: Path) -> None:
    """Take custom-autograd-functions out of the router's 'Start here' table and its route section."""
    router = pack_copy / "using-pytorch-engineering" / "SKILL.md"
    lines = router.read_text().splitlines(keepends=True)
    router.write_text("".join(x for x in lines if "| `custom-autograd-functions` |" not in x))
    terms = pack_copy / "using-pytorch-engineering" / "references" / "routing-terms.md"
    text = terms.read_text()
    terms.write_text(
        text[: text.index("### custom-autograd-functions")] + text[text.index("## Words users use") :]
    )


def test_a_specialist_without_a_route_section_is_reported(pack_copy: Path):
    """A skill nobody can be routed to is a routing hole."""
    _drop_custom_autograd_route(pack_copy)
    assert any("never sends anyone to 'custom-autograd-functions'" in m for m in _messages(pack_copy))


SPECIALIST_BODY_TOKENS = 5000  # chars / 4: a skill loaded into context stays small; details go to references/


def _body(skill_md: Path) -> str:
    """The SKILL.md text after its frontmatter."""
    return skill_md.read_text(encoding="utf-8").split("---", 2)[2]


@pytest.mark.parametrize(
    "skill_md",
    [
        p
        for p in sorted(DEFAULT_SKILLS_DIR.glob("*/SKILL.md"))
        if p.parent.name != "using-pytorch-engineering"
    ],
    ids=lambda p: p.parent.name,
)
def test_each_specialist_skill_body_stays_under_5000_tokens(skill_md: Path):
    """A specialist's SKILL.md body is under 5,000 tokens (counted as characters / 4)."""
    tokens = len(_body(skill_md)) // 4
    assert tokens < SPECIALIST_BODY_TOKENS, (
        f"{skill_md.parent.name}/SKILL.md body is {tokens} tokens; move details into references/"
    )
