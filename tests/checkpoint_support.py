"""Shared set-up for the verify_checkpoint tests: the corpus, built once per test process.

Use `shared_corpus()` from a fixture. The corpus lives in a hidden folder under tests/fixtures
(an allowed root of the shared MCP `client`), removed when the process exits.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from tests.fixtures.checkpoint_corpus import Corpus, build_corpus

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MODELS = FIXTURES / "checkpoint_models.py"


@functools.cache
def shared_corpus() -> Corpus:
    root = Path(tempfile.mkdtemp(prefix=".checkpoint-corpus-", dir=FIXTURES))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return build_corpus(root)


def scratch_dir(name: str) -> Path:
    """A fresh folder inside the corpus root (so the MCP client may read it) for one test's files."""
    path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=shared_corpus().root))
    return path
