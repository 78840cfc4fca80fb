"""What a client owes in time: the next piece of its upload or its next WebSocket message, and a rate.

uvicorn's keep-alive timeout covers idle connections between requests only: a body trickling in, or never
coming, would hold its request's slot for ever. So every wait on a client here has a deadline, and ends early
when the server stops (``stopping``: an event set once the shutdown grace is over).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from .config import ServerConfig
from .openai_api import ApiError

T = TypeVar("T")
NO_RETRY = {"x-should-retry": "false", "connection": "close"}  # the official client retries 408; the body is unread


def shutting_down() -> ApiError:
    return ApiError(503, "the server is shutting down; retry later", code="server_shutting_down")


async def within(awaitable: Awaitable[T], timeout_s: float, stopping: asyncio.Event) -> T:
    """``awaitable``'s result; TimeoutError after ``timeout_s``, the shutdown error once the server stops."""
    task = asyncio.ensure_future(awaitable)
    stop = asyncio.ensure_future(stopping.wait())
    try:
        done, _ = await asyncio.wait({task, stop}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if task in done:
        return task.result()
    task.cancel()
    if stop in done:
        raise shutting_down()
    raise TimeoutError


async def paced(chunks: AsyncIterator[bytes], config: ServerConfig, stopping: asyncio.Event) -> AsyncIterator[bytes]:
    """``chunks`` (a request's body) as long as each arrives within the idle timeout and, once that much time has
    passed, the body so far averages at least the minimum rate; else 408, the client's slot freed."""
    idle, rate = config.idle_timeout_s, config.min_upload_kib_s * 1024
    start, received = time.monotonic(), 0
    pieces = aiter(chunks)
    while True:
        try:
            chunk = await within(anext(pieces), idle, stopping)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise ApiError(408, f"no part of the upload arrived for {idle:g} s", code="upload_timeout",
                           headers=NO_RETRY) from None
        received += len(chunk)
        elapsed = time.monotonic() - start
        if elapsed > idle and received < rate * elapsed:
            raise ApiError(408, f"the upload is too slow: {received / elapsed / 1024:.1f} KiB/s, this server needs "
                           f"at least {config.min_upload_kib_s:g}", code="upload_too_slow", headers=NO_RETRY)
        yield chunk
