"""Every Python block in the skills runs on CPU (or compiles, where it needs CUDA)."""

from __future__ import annotations

import anyio
import pytest

from torch_skills.skillpack.codeblocks import BlockOutcome, check_blocks, python_blocks
from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR

BLOCKS = python_blocks([DEFAULT_SKILLS_DIR])
_IDS = [f"{b.file.relative_to(DEFAULT_SKILLS_DIR).as_posix()}:{b.line}" for b in BLOCKS]


@pytest.fixture(scope="module")
def outcomes() -> dict[str, BlockOutcome]:
    results = anyio.run(check_blocks, BLOCKS)
    return dict(zip(_IDS, results, strict=True))


@pytest.mark.parametrize("block_id", _IDS)
def test_the_skill_code_block_runs(outcomes: dict[str, BlockOutcome], block_id: str):
    """The block runs as a script on CPU (torchrun blocks on two gloo ranks; cuda blocks compile)."""
    outcome = outcomes[block_id]
    assert outcome.passed, f"{block_id} ({outcome.block.mode}):\n{outcome.detail}"


def test_the_skills_hold_python_examples():
    """The pack teaches with runnable code: every specialist has Python blocks."""
    with_blocks = {b.file.relative_to(DEFAULT_SKILLS_DIR).parts[0] for b in BLOCKS}
    assert len(with_blocks) >= 8, f"skills without Python examples: {with_blocks}"
