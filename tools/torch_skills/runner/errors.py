"""Errors that cross the worker boundary.

Raise `UserCodeError(kind, message)` inside a worker when the user's code (or what the user
asked for) is at fault; its message must say what to do next. The pool turns it, and every crash,
hang or memory overrun, into a `WorkerError` on the server side, which the MCP layer returns as a
tool error.
"""

from __future__ import annotations

from typing import Literal

ErrorKind = Literal[
    "bad_request",  # the arguments name something that does not exist or does not fit
    "import_error",  # the user's file or module failed to import
    "user_exception",  # the user's code raised
    "sys_exit",  # the user's code called sys.exit / raised SystemExit
    "out_of_memory",  # an allocation failed or the memory limit was hit
    "file_too_large",  # a write went past the per-call file size limit (RLIMIT_FSIZE)
    "crash",  # the process died from a signal (segfault, abort) or os._exit
    "timeout",  # the call ran past timeout_s
    "cancelled",  # the client cancelled the call
    "worker_unavailable",  # the warm worker could not start or died
    "internal",  # a bug in torch-skills itself
]


class UserCodeError(Exception):
    """An error the caller can fix; raised inside the worker."""

    def __init__(self, kind: ErrorKind, message: str):
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message


class WorkerError(Exception):
    """A failed tool run, as seen by the server: `kind`, a message with the next step, the output tail."""

    def __init__(self, kind: ErrorKind, message: str, output: str = ""):
        text = message if not output.strip() else f"{message}\n\nLast output of the code:\n{output.rstrip()}"
        super().__init__(text)
        self.kind: ErrorKind = kind
        self.message = message
        self.output = output
