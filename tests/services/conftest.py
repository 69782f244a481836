"""Fixtures the service tests share: a test connection to the per-test nats-server with the
topology in place, and an HTTP session carrying the gateway's test admin token."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from libs.bus import Bus
from tests.services._gateway_auth import ADMIN


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    b = await Bus.connect(nats_url, "test")
    await b.ensure_topology()
    yield b
    await b.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A session that sends the admin token (the tests of auth itself are tests/security)."""
    async with aiohttp.ClientSession(headers=ADMIN) as s:
        yield s
