"""A pytest plugin that says what is running when the output would otherwise go quiet.

Use it from a conftest: `pytest_plugins = ["tests.heartbeat"]`. Every `HEARTBEAT_S` seconds
without a finished test, it prints which test (or fixture set-up) is running and for how long,
so a CI log never sits silent for a minute while a long fixture works.
"""

from __future__ import annotations

import sys
import threading
import time

import pytest

HEARTBEAT_S = 30.0


class _Heartbeat:
    def __init__(self) -> None:
        self.current = "collection"
        self.since = time.monotonic()
        self.last_output = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pytest-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(5.0):
            now = time.monotonic()
            if now - self.last_output >= HEARTBEAT_S:
                self.last_output = now
                sys.__stderr__.write(f"\n[still running after {now - self.since:.0f} s: {self.current}]\n")
                sys.__stderr__.flush()


_beat = _Heartbeat()


def pytest_configure(config: pytest.Config) -> None:
    _beat.start()


def pytest_unconfigure(config: pytest.Config) -> None:
    _beat.stop()


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _beat.current = nodeid
    _beat.since = time.monotonic()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or report.failed:
        _beat.last_output = time.monotonic()
