"""Waiting for processes to end, for the runner and boundary tests.

Use `await wait_gone(pid)` after a call that must have killed `pid`: True once it is absent or a
zombie (exited, waiting for its parent to reap it).
"""

from __future__ import annotations

import time

import anyio


def process_gone(pid: int) -> bool:
    """True when the process no longer runs (absent, or a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


async def wait_gone(pid: int, seconds: float = 5) -> bool:
    """Poll until the process is gone or `seconds` pass; True when it is gone."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process_gone(pid):
            return True
        await anyio.sleep(0.05)
    return process_gone(pid)
