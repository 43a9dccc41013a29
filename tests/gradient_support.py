"""Shared helpers for the in-process check_gradients tests (test_gradients_zoo, test_gradients_real_bugs).

The `check` fixture lives in tests/conftest.py; here: `codes(result)` for the finding codes, and
`line_in(path, text)` for the line of a fixture that holds `text`, so tests never hard-code line numbers.
"""

from __future__ import annotations

from pathlib import Path

from torch_skills.gradients.models import GradientResult

REPO_ROOT = Path(__file__).resolve().parents[1]


def line_in(path: Path, text: str) -> int:
    """Line number of the first line of `path` that contains `text`."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {path.name}")


def codes(result: GradientResult) -> list[str]:
    return [f.code for f in result.findings]
