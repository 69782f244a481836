"""KV ``cordons`` under NATS auth (issue 13): the gateway, its one writer, puts and deletes; the
placer reads and watches; no other service user, nor a job producer, can write it."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest

from libs.bus.connection import Bus
from libs.bus.server import NatsServer
from libs.client.credentials import Credentials, load_user
from proto import subjects
from proto.cordons import Cordon
from tests.security.test_nats_auth import _connect, admin, secured

__all__ = ["admin", "secured"]  # fixtures


async def _bus(server: NatsServer, creds: Credentials, user: str) -> Bus:
    return await Bus.connect(server.url, user, attempts=3, **load_user(creds.directory, user))


async def test_only_the_gateway_writes_cordons_and_the_placer_reads_them(
    secured: tuple[NatsServer, Credentials], admin: Bus
) -> None:
    server, creds = secured
    gateway, placer = await _bus(server, creds, "gateway"), await _bus(server, creds, "placer")
    try:
        seen: dict[str, Cordon | None] = {}

        async def on(node: str, value: Cordon | None) -> None:
            seen[node] = value

        await (await placer.kv(subjects.KV_CORDONS, Cordon)).watch(on)
        writer = await gateway.kv(subjects.KV_CORDONS, Cordon)
        await writer.put("n1", Cordon(node="n1", by="admin", reason="maintenance"))
        for _ in range(100):
            if seen.get("n1") is not None:
                break
            await asyncio.sleep(0.02)
        assert seen["n1"] == Cordon(node="n1", by="admin", reason="maintenance")
        await writer.delete("n1")
        for _ in range(100):
            if "n1" in seen and seen["n1"] is None:
                break
            await asyncio.sleep(0.02)
        assert seen["n1"] is None
    finally:
        await gateway.close()
        await placer.close()
    for user in ("placer", "scorer", "executor", "telemetry", "thermal", "producer"):
        nc = await _connect(creds, user)
        try:
            js = nc.jetstream(timeout=1.0)
            with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
                await js.publish(f"$KV.{subjects.KV_CORDONS}.n2", b'{"node":"n2","by":"x"}')
        finally:
            await nc.close()
    # nothing the refused users sent was stored: n1's cordon was deleted, n2 never written
    assert await (await admin.kv(subjects.KV_CORDONS, Cordon)).items() == {}
