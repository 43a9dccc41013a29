"""Text taken from a checkpoint, made safe to carry: escaped, bounded, and never written as advice.

Use:

    file_text(name)                 # lone surrogates, control and format characters escaped; cut to 200
    shown_global("posix.system")    # the name when it is ours to print in prose, else None
    prose_name(name)                # `name` if it is a short identifier-like component, else None
    wire_safe_result(result_dict)   # every string of a verify_checkpoint result escaped and capped

A checkpoint is untrusted input: its global names, tensor names, member names and the messages
loaders raise about it are chosen by whoever wrote the file. They travel only in fields that say
they are file content (`unsafe_globals[].qualified`, `files[].name`, `problems[]`, `tensors`,
`load_error`...), escaped and cut by `wire_safe_result`; the prose an agent reads as advice
(`summary`, `findings[].message`) names a global only when `shown_global` accepts it (one of the
tool's own allow/deny lists, or a real attribute of a module already imported here) and otherwise
points at the field that holds it.

Escaping: a lone surrogate (a byte that was not UTF-8, or a crafted `\\ud800`) becomes the six
characters `\\ud800`, so the result always encodes as UTF-8 and the SDK's serializer cannot fail
on it; C0/C1 control characters become `\\xNN` (newline and tab are kept in prose fields only);
format characters (bidi overrides, zero-width joiners, category Cf) become `\\uNNNN`, so a name
cannot render differently from what it is.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from typing import Any

from torch_skills.checkpoint.allowlist import HARMLESS_DATA, NUMPY_DATA, TORCH_WEIGHTS_ONLY

MAX_FILE_TEXT = 200  # one name from a file: longer than any real tensor, member or global name
MAX_FIELD = 4096  # any other string of a result (load_error, problem messages, recipes)
# result fields whose strings come from the file itself (names, keys, sources), wherever they sit
FILE_TEXT_FIELDS = frozenset(
    "name key source qualified checkpoint_key compared missing unexpected tied_missing "
    "globals_allowed needs_safe_globals parameter state_key module peft_key peft_type".split()
)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,23}")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){1,4}")


def _escape_char(ch: str, keep_newlines: bool) -> str:
    code = ord(ch)
    if 0xD800 <= code <= 0xDFFF:
        return f"\\u{code:04x}"
    if keep_newlines and ch in "\n\t":
        return ch
    category = unicodedata.category(ch)
    if category == "Cc":
        return f"\\x{code:02x}"
    if category in ("Cf", "Zl", "Zp"):
        return f"\\u{code:04x}"
    return ch


def _clean(text: str, keep_newlines: bool) -> str:
    if text.isascii() and text.isprintable():
        return text  # the common case: nothing to escape
    return "".join(_escape_char(ch, keep_newlines) for ch in text)


def cut(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...(+{len(text) - limit} chars)"


def file_text(text: Any, limit: int = MAX_FILE_TEXT) -> str:
    """A string from the file, escaped (no newlines either) and cut to `limit` characters."""
    return cut(_clean(str(text), keep_newlines=False), limit)


def prose_text(text: str, limit: int = MAX_FIELD) -> str:
    """A string the tool wrote (possibly quoting a file): escaped except newlines and tabs, cut."""
    return cut(_clean(text, keep_newlines=True), limit)


def shown_global(qualified: str | None) -> str | None:
    """`qualified` when prose may print it: a name on the tool's own lists, or a real attribute of a
    module that is already imported (posix.system, builtins.eval). Else None: print the field instead."""
    if not qualified or len(qualified) > 80 or not _DOTTED.fullmatch(qualified):
        return None
    if qualified in TORCH_WEIGHTS_ONLY or qualified in NUMPY_DATA or qualified in HARMLESS_DATA:
        return qualified
    module, _, name = qualified.rpartition(".")
    loaded = sys.modules.get(module)  # never imports: a module the file names is not loaded for it
    if loaded is not None and name in vars(loaded):
        return qualified
    return None


def prose_name(component: str) -> str | None:
    """A short identifier (a key prefix such as `module` or `_orig_mod`) prose may quote, else None."""
    return component if _IDENTIFIER.fullmatch(component) else None


def _walk(value: Any, cap: int) -> Any:
    if isinstance(value, str):
        return file_text(value, cap) if cap == MAX_FILE_TEXT else prose_text(value, cap)
    if isinstance(value, dict):
        return {
            _walk(k, MAX_FILE_TEXT): _walk(v, MAX_FILE_TEXT if k in FILE_TEXT_FIELDS else cap)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_walk(v, cap) for v in value]
    return value


def wire_safe_result(result: dict[str, Any]) -> dict[str, Any]:
    """Every string of a result dump escaped and capped: file-content fields at MAX_FILE_TEXT
    (no newlines), the rest at MAX_FIELD. The output always encodes as UTF-8."""
    return _walk(result, MAX_FIELD)
