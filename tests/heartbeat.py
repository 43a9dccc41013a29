"""A pytest plugin that says what is running when the output would otherwise go quiet.

Use it from a conftest: `pytest_plugins = ["tests.heartbeat"]`. Every `HEARTBEAT_S` seconds
without a finished test, it prints which test (or fixture set-up) is running and for how long,
so a CI log never sits silent for a minute while a long fixture works.

It writes to the terminal pytest started with, not to fd 2: during a test pytest's output capture
points fd 2 at a temporary file, which would swallow the line until the test ends.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

HEARTBEAT_S = float(os.environ.get("TORCH_SKILLS_TEST_HEARTBEAT_S", "30"))  # the env var is for its own test


class _Heartbeat:
    def __init__(self) -> None:
        self.current = "collection"
        self.since = time.monotonic()
        self.last_output = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pytest-heartbeat", daemon=True)
        self._fd: int | None = None

    def start(self, config: pytest.Config) -> None:
        self._fd = _uncaptured_stderr_fd(config)
        self._thread.start()

    def write(self, text: str) -> None:
        if self._fd is None:
            sys.__stderr__.write(text)
            sys.__stderr__.flush()
            return
        try:
            os.write(self._fd, text.encode("utf-8", "replace"))
        except OSError:
            pass

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(min(5.0, HEARTBEAT_S / 2)):
            now = time.monotonic()
            if now - self.last_output >= HEARTBEAT_S:
                self.last_output = now
                self.write(f"\n[still running after {now - self.since:.0f} s: {self.current}]\n")


def _uncaptured_stderr_fd(config: pytest.Config) -> int | None:
    """A duplicate of the stderr pytest was started with (before its fd capture), or None."""
    capman = config.pluginmanager.getplugin("capturemanager")
    saved = getattr(getattr(getattr(capman, "_global_capturing", None), "err", None), "targetfd_save", None)
    try:
        return os.dup(saved) if isinstance(saved, int) else None
    except OSError:
        return None


_beat = _Heartbeat()


def pytest_configure(config: pytest.Config) -> None:
    _beat.start(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    _beat.stop()


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _beat.current = nodeid
    _beat.since = time.monotonic()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or report.failed:
        _beat.last_output = time.monotonic()
