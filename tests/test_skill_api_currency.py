"""The skills teach current torch 2.x APIs, not the deprecated ones."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torch_skills.skillpack.codeblocks import python_blocks
from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR

MARKDOWN = sorted(DEFAULT_SKILLS_DIR.rglob("*.md"))
BLOCKS = python_blocks([DEFAULT_SKILLS_DIR])

# In code: never acceptable, whatever the prose around it says.
DEPRECATED_IN_CODE = {
    r"torch\.cuda\.amp": "use torch.amp.autocast('cuda', ...) / torch.amp.GradScaler('cuda')",
    r"from torch\.cuda import amp": "use torch.amp",
    r"torch\.distributed\.launch": "use torchrun",
    r"\bVariable\(": "tensors carry autograd state since 0.4",
    r"volatile\s*=": "use torch.no_grad() / torch.inference_mode()",
    r"register_backward_hook\(": "use register_full_backward_hook",
    r"torch\.backends\.cuda\.sdp_kernel": "use torch.nn.attention.sdpa_kernel",
    r"\bnn\.DataParallel\(|torch\.nn\.DataParallel\(": "use DistributedDataParallel",
    r"use_reentrant\s*=\s*True": "pass use_reentrant=False",
    r"with_modules\s*=\s*True": "profiler with_modules is TorchScript-only, deprecated from 2.14: use with_stack=True",
}
# In prose: only inside a sentence that says it is deprecated or not to use it.
PROSE_WARNING = re.compile(
    r"deprecat|legacy|instead|never|don't|do not|not the|old|replace|removed|avoid", re.I
)


def _block_id(block) -> str:
    return f"{block.file.relative_to(DEFAULT_SKILLS_DIR).as_posix()}:{block.line}"


@pytest.mark.parametrize("block", BLOCKS, ids=_block_id)
def test_code_blocks_use_no_deprecated_api(block):
    """No block calls torch.cuda.amp, Variable, DataParallel and the like."""
    for pattern, fix in DEPRECATED_IN_CODE.items():
        assert not re.search(pattern, block.code), f"{_block_id(block)} uses {pattern}: {fix}"


@pytest.mark.parametrize("block", BLOCKS, ids=_block_id)
def test_torch_load_with_weights_only_false_says_why(block):
    """weights_only=False (which unpickles arbitrary code) comes with a comment that the file must be trusted."""
    for call in re.finditer(r"torch\.load\(", block.code):
        tail = block.code[call.end() - 1 : call.end() + 400]  # from the opening parenthesis
        depth, end = 0, len(tail) - 1
        for i, ch in enumerate(tail):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                end = i
                break
        args = tail[: end + 1]
        if re.search(r"weights_only\s*=\s*False", args):
            line_end = block.code.find("\n", call.end() + end)
            context = block.code[max(0, call.start() - 300) : line_end]
            assert "#" in context and re.search(r"trust", context, re.I), (
                f"{_block_id(block)}: weights_only=False needs a comment saying the file must be trusted"
            )


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: p.relative_to(DEFAULT_SKILLS_DIR).as_posix())
def test_prose_mentions_deprecated_apis_only_to_warn_against_them(path: Path):
    """A sentence naming torch.cuda.amp or torch.distributed.launch must say it is deprecated or not to use it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    in_fence = False
    for number, line in enumerate(lines, start=1):
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        sentence = " ".join(lines[max(0, number - 2) : number + 1])  # a sentence may wrap across lines
        for pattern in (r"torch\.cuda\.amp", r"torch\.distributed\.launch"):
            if re.search(pattern, line):
                assert PROSE_WARNING.search(sentence), (
                    f"{path}:{number} mentions {pattern} without warning against it"
                )
