"""Helpers of the security tests: an HTTP session with no default credentials, so that every
call says which token (if any) it sends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A session with no default credentials: every call says which token it sends."""
    async with aiohttp.ClientSession() as s:
        yield s


async def call(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    token: str | None = None,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, dict[str, str]]:
    """(status, decoded JSON body or text, response headers)."""
    hdrs = dict(headers or {})
    if token is not None:
        hdrs["Authorization"] = f"Bearer {token}"
    async with http.request(method, url, json=body, headers=hdrs) as r:
        data: Any = await r.json() if r.content_type == "application/json" else await r.text()
        return r.status, data, dict(r.headers)


def job(job_id: str, **fields: Any) -> dict[str, Any]:
    return {"id": job_id, "gpus": 1, "gpu_mem_gb": 8, "est_runtime_s": 600, **fields}
