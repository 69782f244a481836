"""Producers on the bus (issue 13): a JobSpec published on ``jobs.submit`` becomes a job as an HTTP
submission does, against a real nats-server and the gateway's real ``main``.

Each test looks where a user would (the HTTP API, the LIFECYCLE stream, ``dlq.gateway``): a job
that appears, appears once, is refused with its field named, or a message that is parked while
the gateway keeps serving; and a submission published while the gateway is down is not lost.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from libs.bus import Bus
from libs.bus.runtime import ServiceConfig, serve
from libs.bus.server import NatsServer, free_port, start_nats_server
from libs.client.credentials import Credentials, load_user
from libs.client.producer import Producer
from libs.clock import Clock
from libs.policy.inventory import demo_cluster
from proto import subjects
from proto.decisions import DeadLetter
from proto.events import Failed, LifecycleEvent, Submitted
from proto.jobs import JobSpec
from proto.nodes import NodeSpec
from proto.views import SubmitResponse
from services.gateway.service import main
from tests.services._gateway_auth import admin_token_file
from tests.services.test_gateway import get_job, post_job, stream_count, until

# --- helpers ------------------------------------------------------------------------------------


@asynccontextmanager
async def gateway(url: str, creds: str | None = None) -> AsyncIterator[str]:
    """The gateway's real ``main`` (as ``tests.services.test_gateway.gateway``), optionally as
    its own NATS user (``creds``: its credentials file); yields the base URL once healthy."""
    port = free_port()
    stop = asyncio.Event()
    args = argparse.Namespace(
        http_host="127.0.0.1", http_port=port, admin_token_file=str(admin_token_file())
    )
    config = ServiceConfig(
        nats_url=url, log_format="console", log_level="warning", nats_creds=creds
    )
    task = asyncio.create_task(
        serve(
            "gateway",
            main,
            config,
            args=args,
            stop=stop,
            install_signals=False,
            clock=Clock(epoch=time.time()),
        )
    )
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        await until(lambda: _healthy(http, base, task), "gateway healthy")
    try:
        yield base
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 15) == 0


async def _healthy(http: aiohttp.ClientSession, base: str, task: asyncio.Task[Any]) -> bool:
    if task.done():
        raise AssertionError(f"the gateway exited: {task.result()!r}")
    try:
        async with http.get(f"{base}/healthz") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


async def publish(bus: Bus, body: Any, msg_id: str | None) -> bool:
    """What a producer with the ``nats`` CLI does: raw JSON on jobs.submit."""
    data = body if isinstance(body, bytes) else msgspec.json.encode(body)
    return await bus.publish_bytes(subjects.SUBJECT_SUBMIT, data, msg_id=msg_id)


async def lifecycle_of(bus: Bus, job_id: str) -> list[LifecycleEvent]:
    """Every event of ``job_id`` on the LIFECYCLE stream, in order, read without the gateway."""
    info = await bus.js.stream_info(subjects.STREAM_LIFECYCLE)
    out: list[LifecycleEvent] = []
    if not info.state.messages:
        return out
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        raw = await bus.js.get_msg(subjects.STREAM_LIFECYCLE, seq)
        if raw.subject == subjects.lifecycle(job_id):
            out.append(msgspec.json.decode(raw.data, type=LifecycleEvent))
    return out


async def consumer_done(bus: Bus) -> bool:
    """The gateway's producer consumer has handled (acked) every jobs.submit message."""
    info = await bus.js.consumer_info(subjects.STREAM_JOBS, subjects.CONSUMER_SUBMIT)
    return info.num_pending == 0 and info.num_ack_pending == 0


async def dead_letters(bus: Bus) -> list[DeadLetter]:
    try:
        info = await bus.js.stream_info(subjects.STREAM_DLQ)
    except Exception:
        return []
    out: list[DeadLetter] = []
    if not info.state.messages:
        return out
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        raw = await bus.js.get_msg(subjects.STREAM_DLQ, seq)
        if raw.subject == subjects.dlq("gateway"):
            out.append(msgspec.json.decode(raw.data, type=DeadLetter))
    return out


# --- a producer's job is a job ------------------------------------------------------------------


async def test_a_bus_submission_becomes_a_job_in_the_api_and_on_the_lifecycle(nats_url, bus, http):
    async with gateway(nats_url) as base:
        assert await publish(bus, {"id": "bus-1", "gpus": 2, "tenant": "vision"}, "bus-1")
        view = await until(lambda: get_job(http, base, "bus-1"), "the bus job in the API")
        assert (view.state, view.tenant, view.gpus) == ("pending", "vision", 2.0)
        assert view.submit_time is not None  # stamped by the gateway, as over HTTP
        events = await until(lambda: lifecycle_of(bus, "bus-1"), "its Submitted")
        assert [type(e) for e in events] == [Submitted]
        assert events[0].spec.gpus == 2.0 and events[0].spec.tenant == "vision"
        async with http.get(f"{base}/v1/jobs", params={"tenant": "vision"}) as r:
            assert [j["id"] for j in (await r.json())["jobs"]] == ["bus-1"]


async def test_a_repeat_is_one_job_and_http_submissions_get_no_second_submitted(
    nats_url, bus, http
):
    async with gateway(nats_url) as base:
        assert await publish(bus, {"id": "rep", "gpus": 1}, "rep")
        assert not await publish(bus, {"id": "rep", "gpus": 4}, "rep")  # the stream's dedupe
        await until(lambda: get_job(http, base, "rep"), "the job")
        # past the stream's duplicate window (a message id of its own): the gateway's own check
        assert await publish(bus, {"id": "rep", "gpus": 4}, "rep-again")
        await until(lambda: consumer_done(bus), "the consumer handled every message")
        status, body = await post_job(http, base, {"id": "rep", "gpus": 8})
        assert status == 200 and msgspec.json.decode(body, type=SubmitResponse).duplicate
        # an HTTP job: its jobs.submit reaches the consumer too, and is left alone
        status, _ = await post_job(http, base, {"id": "web", "gpus": 1})
        assert status == 201
        await until(lambda: consumer_done(bus), "the consumer handled every message")
        assert len(await lifecycle_of(bus, "rep")) == 1
        assert len(await lifecycle_of(bus, "web")) == 1
        assert (await get_job(http, base, "rep")).gpus == 1.0  # the first one counts
        assert await stream_count(bus, subjects.STREAM_LIFECYCLE) == 2


# --- refusals and dead letters ------------------------------------------------------------------


async def _ended(http, base: str, job_id: str):  # type: ignore[no-untyped-def]
    view = await get_job(http, base, job_id)
    return view if view is not None and view.state != "pending" else None


async def test_an_invalid_spec_is_refused_on_its_lifecycle_with_the_field_named(
    nats_url, bus, http
):
    nodes_kv = await bus.kv(subjects.KV_NODES, NodeSpec)
    cluster = demo_cluster()
    for node in cluster:
        await nodes_kv.put(node.id, node)
    cases = {
        "neg": ({"id": "neg", "gpus": -1}, "gpus"),
        "green": ({"id": "green", "energy_sensitivity": 1.5}, "energy_sensitivity"),
        "huge": ({"id": "huge", "gpus": 48}, "gpus"),  # no nodes could ever hold it
        "cmd": ({"id": "cmd", "command": "echo hi"}, "command"),  # tenant may not run commands
    }
    async with gateway(nats_url) as base:

        async def all_nodes() -> bool:
            async with http.get(f"{base}/v1/nodes") as r:
                return len((await r.json())["nodes"]) == len(cluster)

        await until(all_nodes, "the gateway sees every node")
        for job_id, (body, _) in cases.items():
            await publish(bus, body, job_id)
        for job_id, (_, field) in cases.items():
            # the read model may show the Submitted before the Failed that follows it
            view = await until(lambda j=job_id: _ended(http, base, j), f"{job_id} ended")
            assert view.state == "failed", view
            assert view.reason.startswith("Refused: ") and f"{field}: " in view.reason, view
            events = await until(lambda j=job_id: lifecycle_of(bus, j), f"{job_id}'s events")
            assert [type(e) for e in events] == [Submitted, Failed], events
        assert "no node" in (await get_job(http, base, "huge")).reason
        assert (await lifecycle_of(bus, "cmd"))[0].spec.command is None  # nothing could run it
        await publish(bus, {"id": "neg", "gpus": -1}, "neg-again")  # a repeat: refused once
        await until(lambda: consumer_done(bus), "the consumer handled every message")
        assert len(await lifecycle_of(bus, "neg")) == 2
        assert await dead_letters(bus) == []


async def test_a_tenant_allowed_to_run_commands_may_send_one_over_the_bus(nats_url, bus, http):
    async with gateway(nats_url) as base:
        body = {"name": "ops", "may_run_commands": True}
        async with http.post(f"{base}/v1/tenants", json=body) as r:
            assert r.status == 201, await r.text()
        await publish(bus, {"id": "ok-cmd", "tenant": "ops", "command": "true"}, "ok-cmd")
        view = await until(lambda: get_job(http, base, "ok-cmd"), "the job")
        assert (view.state, view.spec.command) == ("pending", "true")


async def test_an_undecodable_message_is_dead_lettered_and_the_gateway_keeps_serving(
    nats_url, bus, http
):
    garbage = {
        b"not json at all": "json",
        b"[1, 2]": "body",
        b'{"id": "typed", "gpus": "four"}': "gpus",
        b'{"id": "typo", "gpu": 4}': "gpu",
        b'{"gpus": 1}': "id",
        b'{"id": "no spaces allowed"}': "no usable job id",
    }
    async with gateway(nats_url) as base:
        for i, data in enumerate(garbage):
            await publish(bus, data, f"garbage-{i}")
        letters = await until(
            lambda: _at_least(dead_letters(bus), len(garbage)), "every message dead-lettered"
        )
        assert {bytes(lt.data) for lt in letters} == set(garbage)
        for lt in letters:
            assert lt.subject == subjects.SUBJECT_SUBMIT and lt.service == "gateway"
            assert garbage[bytes(lt.data)] in lt.reason.lower(), lt
        # still serving, and still consuming
        await publish(bus, {"id": "after", "gpus": 1}, "after")
        assert (await until(lambda: get_job(http, base, "after"), "a job after")).state
        for job_id in ("typed", "typo"):
            assert await get_job(http, base, job_id) is None
        async with http.get(f"{base}/healthz") as r:
            assert r.status == 200


async def _at_least(letters: Any, n: int) -> list[DeadLetter] | None:
    got = await letters
    return got if len(got) >= n else None


# --- durability ---------------------------------------------------------------------------------


async def test_a_submission_published_while_the_gateway_is_down_becomes_a_job(nats_url, bus, http):
    async with gateway(nats_url) as base:
        await publish(bus, {"id": "before", "gpus": 1}, "before")
        await until(lambda: get_job(http, base, "before"), "a job before the restart")
    await publish(bus, {"id": "while-down", "gpus": 1}, "while-down")
    await publish(bus, {"id": "while-down-bad", "gpus": 0}, "while-down-bad")
    async with gateway(nats_url) as base:
        view = await until(lambda: get_job(http, base, "while-down"), "the job after restart")
        assert view.state == "pending"
        bad = await until(lambda: get_job(http, base, "while-down-bad"), "the refused one")
        assert bad.state == "failed" and "gpus: " in bad.reason
        await until(lambda: consumer_done(bus), "the consumer handled every message")
        assert len(await lifecycle_of(bus, "before")) == 1  # not judged again after the restart


# --- the SDK, as the NATS user ``producer`` ----------------------------------------------------


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[NatsServer, Credentials]]:
    """A server with ``mosaic up``'s users and permissions, and their credential files."""
    creds = Credentials.generate(tmp_path / "credentials")
    server = start_nats_server(tmp_path / "nats", auth=creds.server_authorization())
    creds.write(server.url)
    try:
        yield server, creds
    finally:
        server.stop()


async def test_the_sdk_producer_submits_and_cancels_with_the_producer_credentials(secured, http):
    server, creds = secured
    admin = await Bus.connect(
        server.url, "admin", attempts=3, **load_user(creds.directory, "admin")
    )
    try:
        await admin.ensure_topology()
        gateway_creds = str(creds.path("gateway"))
        async with gateway(server.url, gateway_creds) as base:
            producer = await Producer.connect(credentials=creds.path("producer"))
            async with producer:
                assert await producer.submit(JobSpec(id="sdk-1", gpus=1, tenant="nlp"))
                assert not await producer.submit(JobSpec(id="sdk-1", gpus=1, tenant="nlp"))
                view = await until(lambda: get_job(http, base, "sdk-1"), "the SDK's job")
                assert (view.state, view.tenant) == ("pending", "nlp")
                assert await producer.submit(JobSpec(id="sdk-bad", gpus=100))
                bad = await until(lambda: get_job(http, base, "sdk-bad"), "the refused job")
                assert bad.state == "failed" and "gpus: " in bad.reason
                assert await producer.cancel("sdk-1")
                raw = await admin.js.get_last_msg(subjects.STREAM_JOBS, subjects.SUBJECT_CANCEL)
                assert msgspec.json.decode(raw.data)["job_id"] == "sdk-1"
                with pytest.raises(ValueError):
                    await producer.submit(JobSpec(id="not an id"))
            # the same with user and password instead of the file
            password = creds.passwords["producer"]
            async with await Producer.connect(server.url, user="producer", password=password) as p:
                assert await p.submit(JobSpec(id="sdk-2"))
                await until(lambda: get_job(http, base, "sdk-2"), "the second SDK job")
            assert await dead_letters(admin) == []
    finally:
        await admin.close()
