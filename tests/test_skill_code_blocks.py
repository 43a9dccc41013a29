"""Every Python block in the skills runs on CPU (or compiles, where it needs CUDA).

Multi-process (`torchrun`) blocks and blocks tagged `slow` run only in the slow set:
`python -m pytest -m slow tests/test_skill_code_blocks.py`.
"""

from __future__ import annotations

import anyio
import pytest

from torch_skills.skillpack.codeblocks import BlockOutcome, CodeBlock, check_blocks, python_blocks
from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR

BLOCKS = python_blocks([DEFAULT_SKILLS_DIR])


def _block_id(block: CodeBlock) -> str:
    return f"{block.file.relative_to(DEFAULT_SKILLS_DIR).as_posix()}:{block.line}"


FAST = [b for b in BLOCKS if not b.slow]
SLOW = [b for b in BLOCKS if b.slow]


def _check(blocks: list[CodeBlock]) -> dict[str, BlockOutcome]:
    results = anyio.run(check_blocks, blocks)
    return {_block_id(b): o for b, o in zip(blocks, results, strict=True)}


@pytest.fixture(scope="module")
def outcomes() -> dict[str, BlockOutcome]:
    return _check(FAST)


@pytest.fixture(scope="module")
def slow_outcomes() -> dict[str, BlockOutcome]:
    return _check(SLOW)


@pytest.mark.parametrize("block_id", [_block_id(b) for b in FAST])
def test_the_skill_code_block_runs(outcomes: dict[str, BlockOutcome], block_id: str):
    """The block runs as a script on CPU (torchrun blocks on two gloo ranks; cuda blocks compile)."""
    outcome = outcomes[block_id]
    assert outcome.passed, f"{block_id} ({outcome.block.mode}):\n{outcome.detail}"


@pytest.mark.slow
@pytest.mark.parametrize("block_id", [_block_id(b) for b in SLOW])
def test_the_slow_skill_code_block_runs(slow_outcomes: dict[str, BlockOutcome], block_id: str):
    """A block tagged `slow` (a long script, often on two gloo ranks) runs to the end on CPU."""
    outcome = slow_outcomes[block_id]
    assert outcome.passed, f"{block_id} ({outcome.block.mode}):\n{outcome.detail}"


def test_the_skills_hold_python_examples():
    """The pack teaches with runnable code: every specialist has Python blocks."""
    with_blocks = {b.file.relative_to(DEFAULT_SKILLS_DIR).parts[0] for b in BLOCKS}
    assert len(with_blocks) >= 8, f"skills without Python examples: {with_blocks}"


def test_a_slow_tag_combines_with_the_block_mode(tmp_path):
    """`python torchrun slow` is a torchrun block kept out of the default run; untagged blocks are fast."""
    from torch_skills.skillpack.codeblocks import extract_blocks

    page = tmp_path / "page.md"
    page.write_text(
        "```python torchrun slow\nprint(1)\n```\n\n```python\nprint(2)\n```\n\n```python torchrun\nprint(3)\n```\n"
    )
    slow, fast, multi_process = extract_blocks(page)
    assert (slow.mode, slow.slow) == ("torchrun", True)
    assert (fast.mode, fast.slow) == ("run", False)
    assert (multi_process.mode, multi_process.slow) == ("torchrun", True)


def test_only_a_rank_killed_by_a_signal_earns_a_second_torchrun():
    """A signal death with no traceback from the block is retried once; the block's own errors never are."""
    from torch_skills.skillpack.codeblocks import _died_of_a_signal

    signal_death = "terminate called without an active exception\nfailed (exitcode: -6) local_rank: 0"
    block_error = (
        'Traceback (most recent call last):\n  File "/tmp/w/block.py", line 9\nAssertionError\nexitcode: -6'
    )
    assert _died_of_a_signal(signal_death)
    assert not _died_of_a_signal(block_error)
    assert not _died_of_a_signal("failed (exitcode: 1) local_rank: 0")
