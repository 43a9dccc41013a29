"""Keep an async context manager open across a pytest-asyncio fixture's setup and teardown.

Use in a fixture: `async with entered_in_own_task(lambda: Client(server)) as client: yield client`.

pytest-asyncio runs a fixture's setup and teardown in different tasks, but anyio cancel scopes
(inside `Client`, `WorkerPool` and MCP servers) must be exited by the task that entered them. So
one task of its own enters the context manager, hands over the value, and exits it at teardown.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

T = TypeVar("T")


@contextlib.asynccontextmanager
async def entered_in_own_task(
    make: Callable[[], AbstractAsyncContextManager[T]], start_timeout_s: float = 120
) -> AsyncIterator[T]:
    ready: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    done = asyncio.Event()

    async def hold() -> None:
        async with make() as value:
            ready.set_result(value)
            await done.wait()

    task = asyncio.create_task(hold())
    await asyncio.wait({ready, task}, timeout=start_timeout_s, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()  # entering failed: raise its error here
    try:
        yield ready.result()
    finally:
        done.set()
        await task
