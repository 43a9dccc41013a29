"""Tracebacks as a user reads them: their own frames first, the library frames after.

Use it wherever a tool error carries a traceback:

    text = user_traceback(exc)        # "Your code (innermost last):" block, the error, a short library tail
    where = user_location(exc)        # "model.py:12" of the innermost frame in the user's code, or None

A frame is the user's when its file lies outside the standard library, the installed packages
(site-packages / dist-packages) and this package. The error a wrong input layout raises deep in
`torch.nn.functional` is then shown with the line of the user's `forward` that passed the tensor,
instead of five frames of torch internals.

Known limitations: code the user installed into site-packages (an editable install is fine: its
files stay in the project) counts as a library; frames of `exec`'d strings ("<string>") are left out.
"""

from __future__ import annotations

import os
import sysconfig
import traceback

from torch_skills import OWN_DIRS

_LIBRARY_DIRS = tuple(
    {
        os.path.realpath(sysconfig.get_paths()[k]) + os.sep
        for k in ("stdlib", "platstdlib", "purelib", "platlib")
    }
)
LIBRARY_TAIL_FRAMES = 3  # library frames kept after the user's, innermost last
MAX_CHARS = 4000


def is_user_file(filename: str) -> bool:
    """Whether a frame's file is the user's own code (not Python's, an installed package's or ours)."""
    if not filename or filename.startswith("<"):
        return False
    if filename.startswith(OWN_DIRS):
        return False
    real = os.path.realpath(filename)
    if real.startswith(OWN_DIRS) or real.startswith(_LIBRARY_DIRS):
        return False
    return "site-packages" not in real.split(os.sep) and "dist-packages" not in real.split(os.sep)


def _is_own(filename: str) -> bool:
    return filename.startswith(OWN_DIRS) or os.path.realpath(filename).startswith(OWN_DIRS)


def user_location(exc: BaseException) -> str | None:
    """'path/file.py:12' of the innermost frame in the user's code, or None when no frame is theirs."""
    where = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if is_user_file(frame.filename):
            where = f"{frame.filename}:{frame.lineno}"
    if isinstance(exc, SyntaxError) and exc.filename and is_user_file(exc.filename):
        where = f"{exc.filename}:{exc.lineno}"
    return where


def user_traceback(exc: BaseException, max_chars: int = MAX_CHARS, *, with_error: bool = True) -> str:
    """The traceback with the user's frames first, then the error (unless the caller already wrote it:
    `with_error=False`), then the innermost library frames."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if is_user_file(f.filename)]
    error = "".join(traceback.format_exception_only(type(exc), exc)).rstrip()
    library = [f for f in frames if not is_user_file(f.filename) and not _is_own(f.filename)]
    library = library[-LIBRARY_TAIL_FRAMES:]
    parts = []
    if mine:
        parts.append("Your code (innermost last):\n" + "".join(traceback.format_list(mine)).rstrip())
    if with_error:
        parts.append(error)
    if library:
        parts.append("Raised inside (innermost last):\n" + "".join(traceback.format_list(library)).rstrip())
    text = "\n".join(parts)
    if len(text) > max_chars:  # keep the user's frames and the error whole where possible: cut the middle
        half = max_chars // 2
        text = text[:half] + "\n[...]\n" + text[-half:]
    return text
