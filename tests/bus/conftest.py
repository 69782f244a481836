"""Helpers for bus tests: a connected Bus with the topology in place, and polling."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest

from libs.bus import Bus


async def wait_for(pred: Callable[[], bool], timeout_s: float = 5.0, what: str = "") -> None:
    """Poll ``pred`` until true; fail with ``what`` after ``timeout_s`` (no timing asserts)."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or pred}")
        await asyncio.sleep(0.02)


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    b = await Bus.connect(nats_url, "test")
    await b.ensure_topology()
    try:
        yield b
    finally:
        await b.close()
