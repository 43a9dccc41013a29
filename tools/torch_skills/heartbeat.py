"""Progress that keeps a long tool call alive: the worker's own phases plus a regular heartbeat.

Use it around a job:

    async with Heartbeat(ctx.report_progress, label="profile_model", interval_s=5) as beat:
        beat.status("queued: waiting for a worker slot")
        job = await pool.run(..., on_progress=beat.phase)

Why: many clients stop waiting for a request after a fixed time unless a progress notification
arrives (the TypeScript SDK: 60 s by default, reset on progress only when the caller asks for
`resetTimeoutOnProgress`), while a torch tool may compute for minutes without finishing a phase.
So whenever `interval_s` passes without a notification, one is sent saying what the call is doing
and for how long it has been at it.

Values: every notification carries a strictly larger `progress` than the one before, as the
spec requires. A worker phase report `(done, total)` is passed on as is (raised just above the
last value sent if it would not increase); the k-th heartbeat after it sends
`done + 0.5 * k / (k + 1)`, which grows with every beat but stays below `done + 0.5`, so the
worker's next whole step still goes up and `progress / total` stays an honest fraction.
`total` is sent only while it is at least the value sent.

Known limitations: a heartbeat says the job is alive, not that it advances; a job stuck in user
code keeps beating until its `timeout_s` stops it. Sending is best-effort: a notification that
cannot be delivered (client gone) is dropped, the job goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

log = logging.getLogger("torch-skills")

SendProgress = Callable[[float, float | None, str | None], Awaitable[Any]]

# Seconds between notifications when nothing else was sent: well inside the shortest reset-on-
# progress timeouts clients use (10-60 s). TORCH_SKILLS_HEARTBEAT_S overrides it (server.py).
DEFAULT_INTERVAL_S = 5.0
MIN_STEP = 1e-6  # the least increase when a worker value has to be raised above the last one sent


class Heartbeat:
    """Merges worker phase progress and periodic heartbeats into one increasing progress stream."""

    def __init__(
        self,
        send: SendProgress,
        *,
        label: str,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self._send = send
        self.label = label
        self.interval_s = interval_s
        self._clock = clock
        self._started = clock()
        self._last_sent_at = self._started
        self._last_value: float | None = None
        self._base = 0.0  # the last worker `done`, as sent
        self._total: float | None = None
        self._beats = 0  # heartbeats since the last worker report
        self._doing = "starting"
        self._lock = anyio.Lock()
        self.sent: list[tuple[float, float | None, str]] = []  # (progress, total, message), for tests

    async def __aenter__(self) -> Heartbeat:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._beat_forever)
        return self

    async def __aexit__(self, *exc: object) -> None:
        # The beats stop here; whatever the body raised propagates as itself (not wrapped in an
        # exception group), since the task group never sees it.
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(None, None, None)

    def status(self, doing: str) -> None:
        """What the call is doing before the worker reports (queued, starting): heartbeats say it."""
        self._doing = doing

    async def phase(self, done: float, total: float | None, message: str | None) -> None:
        """A worker progress report: passed on at once, and heartbeats then build on it."""
        async with self._lock:
            value = self._above_last(float(done))
            self._base, self._total, self._beats = value, total, 0
            if message:
                self._doing = message
            await self._emit(value, self._doing)

    async def beat(self) -> None:
        """Send one heartbeat now (the loop calls it; tests may too)."""
        async with self._lock:
            self._beats += 1
            value = self._above_last(self._base + 0.5 * self._beats / (self._beats + 1))
            elapsed = self._clock() - self._started
            await self._emit(value, f"{self._doing} (still running, {elapsed:.0f} s elapsed)")

    async def _beat_forever(self) -> None:
        while True:
            await anyio.sleep(max(0.0, self._last_sent_at + self.interval_s - self._clock()))
            if self._clock() - self._last_sent_at >= self.interval_s * 0.999:
                await self.beat()

    def _above_last(self, value: float) -> float:
        if self._last_value is not None and value <= self._last_value:
            value = self._last_value + max(MIN_STEP, abs(self._last_value) * 1e-9)
        return value

    async def _emit(self, value: float, doing: str) -> None:
        total = self._total if self._total is not None and self._total >= value else None
        message = f"{self.label}: {doing}"
        self._last_value, self._last_sent_at = value, self._clock()
        self.sent.append((value, total, message))
        try:
            await self._send(value, total, message)
        except Exception as e:  # noqa: BLE001 - a lost notification must not fail the job
            log.debug("progress notification not delivered: %s", e)
