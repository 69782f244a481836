"""The gateway's HTTP edge against a real nats-server: unknown fields, Content-Type, body size,
value bounds, aiohttp's own refusals as JSON, and slow clients cut off by the header and body
timeouts (raw sockets that send half a request and then nothing)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from typing import Any

import aiohttp
import msgspec

from libs.bus.server import find_nats_server, free_port
from proto import subjects
from proto.validation import HORIZON_S, MAX_COMMAND_BYTES, MAX_CONSTRAINTS
from proto.views import ErrorResponse, SubmitResponse
from services.gateway.api import MAX_BODY_BYTES
from tests.services._gateway_auth import ADMIN_TOKEN
from tests.services.test_gateway import JSON, gateway, post_job, stream_count

CLOSE_WITHIN_S = 15.0  # generous: the test gateway's timeouts are 1 s
AUTH = f"Authorization: Bearer {ADMIN_TOKEN}\r\n".encode()


async def _error(r: aiohttp.ClientResponse) -> ErrorResponse:
    assert r.headers["Content-Type"].startswith("application/json"), r.headers
    err = msgspec.json.decode(await r.read(), type=ErrorResponse)
    assert err.error
    return err


async def _refused(http: aiohttp.ClientSession, base: str, body: Any) -> tuple[int, list[str]]:
    status, raw = await post_job(http, base, body)
    err = msgspec.json.decode(raw, type=ErrorResponse)
    assert err.error and all(e.reason for e in err.errors), raw
    return status, [e.field for e in err.errors]


async def test_unknown_fields_and_out_of_bounds_values_are_400_naming_the_field(
    nats_url, bus, http
):
    now = time.time()
    cases: list[tuple[Any, str]] = [
        ({"id": "u", "gpu": 4}, "gpu"),  # a typo is not a 1-GPU job
        ({"id": "t", "gpus": 1e-320}, "gpus"),
        ({"id": "z", "gpus": -0.0}, "gpus"),
        (b'{"id": "h", "gpus": 1e400}', "gpus"),
        ({"id": "r", "est_runtime_s": 1e308}, "est_runtime_s"),
        ({"id": "d", "deadline": now + HORIZON_S + 86400}, "deadline"),
        ({"id": "p", "priority": True}, "priority"),
        ({"id": "s", "gpus": "4"}, "gpus"),  # strict: no strings for numbers
        ({"id": "c", "constraints": ["t4"] * (MAX_CONSTRAINTS + 1)}, "constraints"),
        ({"id": "n", "tenant": "x" * 65}, "tenant"),
        ({"id": "k", "command": "echo\x00rm"}, "command"),
        ({"id": "x" * 65}, "id"),
        ({"id": "e", "elastic": {"min_gpus": {"deep": [1]}, "max_gpus": 2}}, "elastic"),
        (b"[" * 100_000 + b"]" * 100_000, "body"),
        (b'{"id": "deep", "x": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_001, "body"),
        (b'{"id": "\xff\xfe"}', "body"),  # not UTF-8
        (b'{"id": "dup"} trailing', "body"),
        (b"", "body"),
    ]
    async with gateway(nats_url) as base:
        for body, field in cases:
            status, fields = await _refused(http, base, body)
            assert status == 400 and field in fields, (body[:80], fields)
        # a command of about 1 MB fits in the body limit but not in a job: named, not a 500
        status, fields = await _refused(http, base, {"id": "big", "command": "x" * 1_000_000})
        assert (status, fields) == (400, ["command"])
        assert await stream_count(bus, subjects.STREAM_JOBS) == 0
        ok = {"id": "fine", "command": "x" * MAX_COMMAND_BYTES, "gpus": 0.01}
        status, raw = await post_job(http, base, ok)
        assert status == 201, raw
        assert msgspec.json.decode(raw, type=SubmitResponse).job.gpus == 0.01


async def test_a_body_over_the_limit_is_a_json_413(nats_url, http):
    async with gateway(nats_url) as base:
        body = b'{"id": "huge", "command": "' + b"x" * MAX_BODY_BYTES + b'"}'
        async with http.post(f"{base}/v1/jobs", data=body, headers=JSON) as r:
            assert r.status == 413
            assert "command" in (await _error(r)).error
        async with http.get(f"{base}/healthz") as r:
            assert r.status == 200


async def test_content_type_must_be_json(nats_url, bus, http):
    body = msgspec.json.encode({"id": "ct", "gpus": 1})
    async with gateway(nats_url) as base:
        for ctype in (
            "text/plain",  # what a cross-origin form post sends without a preflight
            "application/x-www-form-urlencoded",
            "application/json; charset=latin-1",
            None,  # aiohttp then says application/octet-stream
        ):
            headers = {"Content-Type": ctype} if ctype else {}
            async with http.post(f"{base}/v1/jobs", data=body, headers=headers) as r:
                assert r.status == 415, ctype
                assert "application/json" in (await _error(r)).error
        assert await stream_count(bus, subjects.STREAM_JOBS) == 0
        headers = {"Content-Type": "application/json; charset=UTF-8"}
        async with http.post(f"{base}/v1/jobs", data=body, headers=headers) as r:
            assert r.status == 201


async def test_aiohttp_refusals_are_json(nats_url, http):
    async with gateway(nats_url) as base:
        async with http.get(f"{base}/v2/nothing?x=%ff") as r:
            assert r.status == 404 and "/v2/nothing" in (await _error(r)).error
        async with http.put(f"{base}/v1/jobs", data=b"{}", headers=JSON) as r:
            assert r.status == 405 and "PUT" in (await _error(r)).error
            assert "POST" in r.headers["Allow"]
        async with http.patch(f"{base}/healthz") as r:
            assert r.status == 405
            await _error(r)
        # refused by the HTTP parser before any handler runs: JSON all the same
        port = int(base.rsplit(":", 1)[1])
        for raw in (
            b"FOO / HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"h" * 9000 + b"\r\n\r\n",
            b"GET /\x00 HTTP/1.1\r\n\r\n",
        ):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(raw)
            answer = await _closed_within(reader, CLOSE_WITHIN_S)
            writer.close()
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.split(b" ")[1] == b"400" and b"application/json" in head, answer
            assert msgspec.json.decode(body, type=ErrorResponse).error.startswith("400 Bad")


async def _closed_within(reader: asyncio.StreamReader, limit_s: float) -> bytes:
    """Everything the server sends until it closes; fails if it keeps the connection open."""
    got = b""
    deadline = time.monotonic() + limit_s
    while chunk := await asyncio.wait_for(reader.read(65536), deadline - time.monotonic()):
        got += chunk
    return got


async def test_slow_clients_are_closed_and_others_are_served(nats_url, http):
    async with gateway(nats_url, http_header_timeout_s=1.0, http_body_timeout_s=1.0) as base:
        port = int(base.rsplit(":", 1)[1])
        conns = []
        for i in range(60):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            if i % 3 == 1:  # half a request head, then nothing
                writer.write(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Ty")
            elif i % 3 == 2:  # a full head, a tenth of the body it announced, then nothing
                writer.write(
                    b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    + AUTH
                    + b'Content-Length: 100\r\n\r\n{"id": "s'
                )
            await writer.drain()
            conns.append((i, reader, writer))
        # meanwhile a normal client is served, also by a request that takes several sweeps
        async with http.get(f"{base}/healthz") as r:
            assert r.status == 200
        started = time.monotonic()
        answers = await asyncio.gather(*(_closed_within(r, CLOSE_WITHIN_S) for _, r, _ in conns))
        assert time.monotonic() - started < CLOSE_WITHIN_S
        for (i, _, writer), answer in zip(conns, answers, strict=True):
            writer.close()
            if i % 3 == 2:  # the body that never came: a JSON 408, then closed
                head, _, body = answer.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 408"), answer[:200]
                assert msgspec.json.decode(body, type=ErrorResponse).error
            else:
                assert answer == b"", answer[:200]  # nothing to answer: just closed
        status, raw = await post_job(http, base, {"id": "after-the-slow-ones"})
        assert status == 201, raw


async def test_a_job_over_the_bus_payload_limit_is_refused_at_the_edge(tmp_path, http):
    """A server configured with a small max payload: the job is refused naming ``command``
    instead of being published (which would make nats-py drop the gateway's connection)."""
    port = free_port()
    conf = tmp_path / "nats.conf"
    conf.write_text(
        f"listen: 127.0.0.1:{port}\nmax_payload: 16384\n"
        f"jetstream {{ store_dir: {json.dumps(str(tmp_path / 'js'))} }}\n"
    )
    log = (tmp_path / "nats.log").open("wb")
    proc = subprocess.Popen([find_nats_server(), "-c", str(conf)], stdout=log, stderr=log)
    try:
        async with gateway(f"nats://127.0.0.1:{port}") as base:
            big = {"id": "wide-cmd", "command": "x" * 16_000}  # within MAX_COMMAND_BYTES
            status, fields = await _refused(http, base, big)
            assert (status, fields) == (400, ["command"])
            status, raw = await post_job(http, base, {"id": "small"})
            assert status == 201, raw
            async with http.get(f"{base}/healthz") as r:
                assert r.status == 200
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
