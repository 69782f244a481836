"""Stopping a background task so that it really stops.

Why not ``task.cancel(); await task``: on Python 3.11 ``asyncio.wait_for`` can swallow a
cancellation that arrives in the same loop turn as the awaited reply (CPython gh-86296, fixed in
3.12). nats-py waits for every request reply with ``wait_for``, so a loop cancelled while a KV
write was being answered simply runs on, and the ``await task`` that follows waits for good; a
lease release hung that way for five minutes in CI. ``cancel_and_wait`` cancels again each
``retry_s`` until the task has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

RETRY_S = 0.5


async def cancel_and_wait(task: asyncio.Task[Any] | None, *, retry_s: float = RETRY_S) -> None:
    """Cancel ``task`` and wait until it has ended, cancelling again each ``retry_s`` while it
    has not. Whatever the task raised or returned is dropped: the caller is shutting it down."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=retry_s)
    with contextlib.suppress(asyncio.CancelledError, Exception):
        task.result()
