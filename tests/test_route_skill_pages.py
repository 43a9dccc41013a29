"""The skill folder an agent reads: file sizes, the router SKILL.md's budget, and long files in pages."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from mcp import Client

from tests.owned import entered_in_own_task
from torch_skills.server import build_server
from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR, ROUTER_NAME
from torch_skills.skillpack.pages import PAGE_CHARS, text_page

MAX_FILE_BYTES = 100_000  # an agent's file reader takes the whole file (common limits: 256 KB, 25k tokens)
ROUTER_MAX_TOKENS = 5_000  # Agent Skills guidance for a SKILL.md body, at 4 characters a token


def test_no_file_in_the_skills_folder_is_over_100_kb():
    """Every file an agent may open in skills/ fits a file reader whole."""
    big = [
        f"{p.relative_to(DEFAULT_SKILLS_DIR)}: {p.stat().st_size} bytes"
        for p in DEFAULT_SKILLS_DIR.rglob("*")
        if p.is_file() and p.stat().st_size > MAX_FILE_BYTES
    ]
    assert not big, big


def test_the_router_skill_md_is_at_most_5000_tokens_and_opens_with_its_table():
    """The router SKILL.md is under 5,000 tokens (characters / 4) and its first section is the table."""
    text = (DEFAULT_SKILLS_DIR / ROUTER_NAME / "SKILL.md").read_text(encoding="utf-8")
    assert len(text) / 4 <= ROUTER_MAX_TOKENS, f"{len(text) / 4:.0f} tokens"
    first_section = re.search(r"^## (.+)$", text, re.M)
    assert first_section is not None and first_section.group(1) == "Start here"
    after = text[first_section.end() :].lstrip()
    assert after.startswith("| The user reports or asks | Skill | Run first |")


def test_no_skill_ships_or_links_machine_written_routing_examples():
    """The tool's labelled questions are not in skills/ and no skill file points at them."""
    assert not list(DEFAULT_SKILLS_DIR.rglob("routing-examples*"))
    linked = [
        p for p in DEFAULT_SKILLS_DIR.rglob("*.md") if "routing-examples" in p.read_text(encoding="utf-8")
    ]
    assert not linked, linked


def test_a_page_ends_after_a_whole_line_and_names_the_next_offset():
    """Pages of a long text are at most PAGE_CHARS, end at a line break, and join back to the text."""
    text = "".join(f"line {i}: " + "x" * 70 + "\n" for i in range(3000))  # about 240,000 characters
    pages, offset = [], 0
    while offset is not None:
        page = text_page(text, offset)
        assert len(page.text) <= PAGE_CHARS and page.total_chars == len(text)
        assert page.next_offset is None or page.text.endswith("\n")
        pages.append(page.text)
        offset = page.next_offset
    assert len(pages) >= len(text) // PAGE_CHARS and "".join(pages) == text
    with pytest.raises(ValueError, match="outside the text"):
        text_page(text, len(text))


@pytest.fixture
async def big_pack_client(tmp_path: Path):
    """A server whose debugging skill carries a 300,000-character reference file."""
    skills = tmp_path / "skills"
    shutil.copytree(DEFAULT_SKILLS_DIR, skills)
    big = skills / "debugging-techniques" / "references" / "long-notes.md"
    big.write_text("# Long notes\n\n" + "".join(f"- note {i}: " + "y" * 90 + "\n" for i in range(3000)))
    async with entered_in_own_task(
        lambda: Client(build_server(skills, prewarm=False, torch_tools=[]))
    ) as client:
        yield client, big.read_text()


async def test_get_skill_serves_a_long_file_in_pages_with_the_next_offset(big_pack_client):
    """get_skill returns at most 20,000 tokens a call and the offset to read on; the pages join up."""
    client, whole = big_pack_client
    args = {"name": "debugging-techniques", "path": "references/long-notes.md"}
    got, offset = [], 0
    while offset is not None:
        result = await client.call_tool("get_skill", {**args, "offset": offset})
        assert not result.is_error, result.content[0].text
        page = result.structured_content
        assert len(page["text"]) / 4 <= 20_000 and page["total_chars"] == len(whole)
        got.append(page["text"])
        offset = page["next_offset"]
    assert len(got) >= 4 and "".join(got) == whole
    past = await client.call_tool("get_skill", {**args, "offset": len(whole) + 5})
    assert past.is_error and "next_offset" in past.content[0].text


async def test_a_long_skill_resource_returns_its_first_page_and_how_to_read_on(big_pack_client):
    """A skill:// resource of a long file is its first page plus the get_skill call for the rest."""
    client, whole = big_pack_client
    read = await client.read_resource("skill://debugging-techniques/references/long-notes.md")
    text = read.contents[0].text
    first = text_page(whole)
    assert text.startswith(first.text) and len(text) / 4 <= 20_100
    assert f"offset={first.next_offset})" in text and 'path="references/long-notes.md"' in text
