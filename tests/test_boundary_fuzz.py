"""Property-based fuzzing of the boundary's parsers: references, paths, route input, the wire.

Each property runs a few dozen examples with a deadline, so the file stays a few seconds long.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from torch_skills.refpolicy import ReferenceRefused, refuse_by_name
from torch_skills.roots import AllowedRoots, PathNotAllowed
from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR, SkillPack, SkillPathError, UnknownSkill
from torch_skills.skillpack.route import Router
from torch_skills.userspec import BadName, CodeRef, CodeRefError
from torch_skills.wire import wire_safe, wire_safe_value

FAST = settings(max_examples=60, deadline=500, suppress_health_check=[HealthCheck.too_slow])
# Text as it can reach the server: any code point, lone surrogates (undecodable bytes) and NUL included.
ANY_TEXT = st.text(alphabet=st.characters(codec=None, categories=None), max_size=300)
REFERENCE_LIKE = st.builds(
    lambda a, sep, b: f"{a}{sep}{b}",
    st.one_of(ANY_TEXT, st.from_regex(r"[A-Za-z_./\\-]{0,40}(\.py)?", fullmatch=True)),
    st.sampled_from([":", "::", "", ":."]),
    st.one_of(ANY_TEXT, st.from_regex(r"[A-Za-z_][A-Za-z0-9_.]{0,30}", fullmatch=True)),
)
PACK = SkillPack.load(DEFAULT_SKILLS_DIR)
ROUTER = Router.from_pack(PACK)


@FAST
@given(REFERENCE_LIKE)
def test_any_reference_text_parses_or_gets_a_reference_error(text: str):
    """CodeRef.parse and the name rule never fail with anything but a CodeRefError."""
    try:
        ref = CodeRef.parse(text)
    except CodeRefError as e:
        assert str(e)
        return
    try:
        refuse_by_name(ref)
    except ReferenceRefused as e:
        assert "Fix:" in str(e)


@FAST
@given(st.one_of(ANY_TEXT, st.text(min_size=4000, max_size=5000)))
@example("~0")  # found by this test: '~user' of an unknown user made pathlib raise RuntimeError
def test_any_path_text_is_checked_or_refused_with_a_reason(text: str):
    """AllowedRoots.check answers every string with a path or a PathNotAllowed/BadName, never a crash."""
    roots = AllowedRoots(Path("/tmp/fuzz-project-root"))
    try:
        resolved = roots.check(text)
    except (PathNotAllowed, BadName) as e:
        assert str(e)
        return
    assert resolved.is_relative_to("/tmp/fuzz-project-root")


@FAST
@given(ANY_TEXT)
def test_route_answers_any_text_with_a_result_that_is_valid_utf8_on_the_wire(text: str):
    """route never raises, and its answer serialises as strict UTF-8 JSON once made wire-safe."""
    result = ROUTER.route(text)
    wire = wire_safe_value(result.model_dump(mode="json"))
    json.dumps(wire, ensure_ascii=False).encode("utf-8")


@FAST
@given(ANY_TEXT)
def test_wire_safe_text_always_encodes_and_keeps_valid_text_unchanged(text: str):
    """Lone surrogates become U+FFFD; text that was valid UTF-8 comes back identical."""
    safe = wire_safe(text)
    safe.encode("utf-8")
    try:
        text.encode("utf-8")
        assert safe == text
    except UnicodeEncodeError:
        assert len(safe) == len(text) and "\ufffd" in safe


@FAST
@given(st.sampled_from(sorted(PACK.skills)), st.one_of(ANY_TEXT, st.sampled_from(["SKILL.md", "references"])))
@example("debugging-techniques", "SKILL\x00.md")  # found by issue 21: a bare internal error before
def test_any_skill_file_path_reads_a_file_or_gets_a_skill_path_error(name: str, path: str):
    """SkillPack.read answers every path text with bytes or SkillPathError/UnknownSkill, never a crash."""
    try:
        data = PACK.read(name, path)
    except (SkillPathError, UnknownSkill) as e:
        assert str(e)
        return
    assert isinstance(data, bytes)


def test_a_skill_file_name_longer_than_the_file_system_allows_is_a_skill_path_error():
    """A name of over 255 bytes makes the file system refuse the look-up (ENAMETOOLONG): that is
    "no such file", not a crash (found by the fuzz test above)."""
    name = next(iter(PACK.skills))
    with pytest.raises(SkillPathError, match="no file"):
        PACK.read(name, "0" * 30 + "\u00a1" * 200)
