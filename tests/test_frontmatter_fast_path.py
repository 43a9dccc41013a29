"""The frontmatter fast path (no YAML import at start-up) reads exactly what the YAML parser reads.

Run: `python -m pytest tests/test_frontmatter_fast_path.py`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_skills.skillpack.loader import _plain_mapping, split_frontmatter

REPO = Path(__file__).resolve().parents[1]
YAML_SPECIALS = ":#-?,[]{}&*!|>'\"%@` \t\n\r\x85\u2028.~0123456789"
LETTERS = "abcdefgnoprstuyXYZNOT"
TEXT = st.text(alphabet=st.sampled_from(list(LETTERS * 3) + list(YAML_SPECIALS)), max_size=30)
VALUES = st.one_of(TEXT, st.builds(str.__add__, st.sampled_from(LETTERS), TEXT))  # half start with a letter
KEYS = st.sampled_from(["name", "description", "license", "allowed-tools", "x_y", "on", "Yes"])


@settings(max_examples=600, deadline=None)
@given(st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=3))
def test_the_fast_path_agrees_with_yaml_whenever_it_answers(pairs):
    """For any `key: value` lines the fast path either declines or returns what yaml.safe_load returns."""
    raw = "".join(f"{k}: {v}\n" for k, v in pairs)
    fast = _plain_mapping(raw)
    if fast is not None:
        assert fast == yaml.safe_load(raw)


@pytest.mark.parametrize(
    "raw",
    [
        "name: x\ndescription: Use for: NaN\n",  # a nested mapping
        "name: x\ndescription: ok # comment\n",
        "name: x\ndescription: yes\n",
        "name: x\ndescription: 2024-01-01\n",
        "name: x\ndescription: >\n  folded\n",
        "name: x\ndescription: 'quoted'\n",
        "name: x\nname: y\n",
        "on: x\n",
    ],
)
def test_the_fast_path_declines_what_yaml_reads_differently(raw):
    """Values YAML would not read as the same one-line string go to the YAML parser."""
    assert _plain_mapping(raw) is None


def test_every_shipped_skill_takes_the_fast_path_with_the_yaml_result():
    """The shipped skills' frontmatter needs no YAML import, and reads the same as with it."""
    for skill_md in (REPO / "skills").glob("*/SKILL.md"):
        text = skill_md.read_text()
        raw = text.split("---\n", 2)[1]
        assert _plain_mapping(raw) == yaml.safe_load(raw), skill_md
        assert split_frontmatter(text)[0] == yaml.safe_load(raw)
