"""What the gateway exposes beyond the API's roles: it does not start without an admin token
(unless told, explicitly, to run open), and ``/metrics`` answers loopback freely but anyone
else only with the admin token. Real gateway, real nats-server.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from libs.bus.runtime import ServiceConfig, serve
from libs.bus.server import free_port
from libs.clock import Clock
from services.gateway.service import main
from tests.security.conftest import call, job
from tests.services._gateway_auth import ADMIN_TOKEN, admin_token_file
from tests.services.test_gateway import until


@asynccontextmanager
async def running_gateway(
    nats_url: str, host: str = "127.0.0.1", **args: Any
) -> AsyncIterator[tuple[asyncio.Task[int], int]]:
    """The gateway's ``serve`` task with ``args`` and its port; stopped (exit 0) after, unless
    it has ended by itself."""
    port = free_port()
    stop = asyncio.Event()
    task = asyncio.create_task(
        serve(
            "gateway",
            main,
            ServiceConfig(nats_url=nats_url, log_format="console", log_level="error"),
            args=argparse.Namespace(http_host=host, http_port=port, **args),
            stop=stop,
            install_signals=False,
            clock=Clock(epoch=time.time()),
        )
    )
    try:
        yield task, port
    finally:
        stop.set()
        code = await asyncio.wait_for(task, 15)
        assert code in (0, 1)


async def _serving(http: aiohttp.ClientSession, base: str) -> bool:
    try:
        return (await call(http, "GET", f"{base}/healthz"))[0] == 200
    except aiohttp.ClientError:
        return False


def _outside_address() -> str | None:
    """An address of this machine that is not loopback (the source of a "remote" caller)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the route
            addr = s.getsockname()[0]
        except OSError:
            return None
    return None if addr.startswith("127.") else addr


async def test_without_an_admin_token_the_gateway_refuses_to_start(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MOSAIC_ADMIN_TOKEN_FILE", raising=False)
    short = tmp_path / "short.token"
    short.write_text("abc\n")
    for args in ({}, {"admin_token_file": str(short)}, {"admin_token_file": str(tmp_path / "no")}):
        async with running_gateway(nats_url, **args) as (task, _):
            assert await asyncio.wait_for(task, 10) == 1, args


async def test_insecure_no_auth_is_explicit_and_makes_every_caller_the_admin(nats_url, http):
    async with running_gateway(nats_url, insecure_no_auth=True) as (_, port):
        base = f"http://127.0.0.1:{port}"
        await until(lambda: _serving(http, base), "the insecure gateway")
        status, _, _ = await call(http, "GET", f"{base}/v1/tenants")
        assert status == 200
        t = (await call(http, "POST", f"{base}/v1/tenants", body={"name": "t"}))[1]["token"]
        status, _, _ = await call(http, "POST", f"{base}/v1/jobs", t, job("t-1", tenant="x"))
        assert status == 403  # a tenant token still scopes its caller
        status, _, _ = await call(http, "GET", f"{base}/v1/jobs", "wrong-token")
        assert status == 401


async def test_metrics_free_on_loopback_admin_only_from_elsewhere(nats_url, http):
    outside = _outside_address()
    if outside is None:
        pytest.skip("this machine has no non-loopback address to call from")
    token_file = str(admin_token_file())
    async with running_gateway(nats_url, host="0.0.0.0", admin_token_file=token_file) as (_, port):
        local, remote = f"http://127.0.0.1:{port}", f"http://{outside}:{port}"
        await until(lambda: _serving(http, local), "the gateway on every interface")
        status, text, _ = await call(http, "GET", f"{local}/metrics")
        assert status == 200 and "mosaic_gateway_http_request_seconds" in text
        status, _, headers = await call(http, "GET", f"{remote}/metrics")
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
        tenant = (await call(http, "POST", f"{local}/v1/tenants", ADMIN_TOKEN, {"name": "t"}))[1][
            "token"
        ]
        status, _, _ = await call(http, "GET", f"{remote}/metrics", tenant)
        assert status == 403
        status, text, _ = await call(http, "GET", f"{remote}/metrics", ADMIN_TOKEN)
        assert status == 200 and "mosaic_gateway" in text
        # the refusals are counted (the counter is per process: at least this test's)
        assert 'mosaic_gateway_auth_refused_total{reason="missing"}' in text
        assert 'mosaic_gateway_auth_refused_total{reason="forbidden"}' in text
        # the anonymous dashboard is the same from anywhere: counts only
        status, page, _ = await call(http, "GET", f"{remote}/")
        assert status == 200 and "GPUs busy" in page
