"""The gateway against a real nats-server: admission, idempotent submit, the lifecycle read
model (and its rebuild on restart), cancel, dead letters, health and metrics.

The gateway runs in-process through the same ``serve()`` shell as ``python -m services.gateway``,
on a free port, and is spoken to over HTTP with aiohttp's client, as the CLI does.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import msgspec

from libs.bus import Bus
from libs.bus.runtime import ServiceConfig, serve
from libs.bus.server import free_port
from libs.clock import Clock
from libs.policy.inventory import demo_cluster
from proto import subjects
from proto.decisions import DeadLetter
from proto.events import (
    Cancelled,
    Completed,
    Failed,
    LifecycleEvent,
    Placed,
    Preempted,
    Queued,
    Started,
    Submitted,
)
from proto.jobs import CancelRequest, JobSpec
from proto.ledger import Allocation
from proto.nodes import GpuSample, NodeSpec, TelemetrySample
from proto.views import ErrorResponse, JobView, NodeView, SubmitResponse
from services.gateway.dashboard import render
from services.gateway.jobs_view import JobsModel
from services.gateway.service import main
from tests.services._gateway_auth import admin_token_file

DEADLINE_S = 10.0
JSON = {"Content-Type": "application/json"}


@asynccontextmanager
async def gateway(nats_url: str, port: int | None = None, **args_more: Any) -> AsyncIterator[str]:
    """A gateway on ``port`` (default a free one) with ADMIN_TOKEN as its admin token; yields
    its base URL once healthy, stops it cleanly (exit code 0) after. ``args_more``: more of its
    command line, e.g. ``http_header_timeout_s=1.0`` or ``read_models=ReadModelConfig(...)``."""
    port = port or free_port()
    stop = asyncio.Event()
    args = argparse.Namespace(
        http_host="127.0.0.1",
        http_port=port,
        admin_token_file=str(admin_token_file()),
        **args_more,
    )
    task = asyncio.create_task(
        serve(
            "gateway",
            main,
            ServiceConfig(nats_url=nats_url, log_format="console", log_level="warning"),
            args=args,
            stop=stop,
            install_signals=False,
            clock=Clock(epoch=time.time()),
        )
    )
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        await until(lambda: _healthy(http, base), "gateway healthy")
    try:
        yield base
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 15) == 0


async def _healthy(http: aiohttp.ClientSession, base: str) -> bool:
    try:
        async with http.get(f"{base}/healthz") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


async def until(check: Callable[[], Awaitable[Any]], what: str) -> Any:
    """Poll ``check`` until it returns something truthy; fail after DEADLINE_S."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        got = await check()
        if got:
            return got
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for: {what}")


async def stream_count(bus: Bus, stream: str, subject: str | None = None) -> int:
    info = await bus.js.stream_info(stream, subjects_filter=subject)
    if subject is None:
        return info.state.messages
    return sum((info.state.subjects or {}).values())


async def post_job(http: aiohttp.ClientSession, base: str, body: Any) -> tuple[int, bytes]:
    data = body if isinstance(body, bytes) else msgspec.json.encode(body)
    async with http.post(f"{base}/v1/jobs", data=data, headers=JSON) as r:
        return r.status, await r.read()


async def get_job(http: aiohttp.ClientSession, base: str, job_id: str) -> JobView | None:
    async with http.get(f"{base}/v1/jobs/{job_id}") as r:
        return msgspec.json.decode(await r.read(), type=JobView) if r.status == 200 else None


async def publish_event(bus: Bus, event: LifecycleEvent) -> None:
    await bus.publish(subjects.lifecycle(event.job_id), event)


# --- submission ---------------------------------------------------------------------------------


async def test_submit_publishes_once_and_a_repeat_is_a_duplicate(nats_url, bus, http):
    async with gateway(nats_url) as base:
        status, body = await post_job(http, base, {"id": "train-1", "gpus": 2, "tenant": "vision"})
        assert status == 201, body
        resp = msgspec.json.decode(body, type=SubmitResponse)
        assert not resp.duplicate
        assert (resp.job.id, resp.job.state, resp.job.tenant) == ("train-1", "pending", "vision")
        assert resp.job.submit_time is not None

        raw = await bus.js.get_last_msg(subjects.STREAM_JOBS, subjects.SUBJECT_SUBMIT)
        sent = msgspec.json.decode(raw.data, type=JobSpec)
        assert (sent.id, sent.gpus, sent.submit_time) == ("train-1", 2.0, resp.job.submit_time)
        assert "traceparent" in (raw.headers or {})  # the placement can link back to this request
        trace_id = raw.headers["traceparent"].split("-")[1]
        raw = await bus.js.get_last_msg(subjects.STREAM_LIFECYCLE, subjects.lifecycle("train-1"))
        event = msgspec.json.decode(raw.data, type=LifecycleEvent)
        assert isinstance(event, Submitted) and event.spec == sent
        assert raw.headers["traceparent"].split("-")[1] == trace_id  # one trace per request

        status, body = await post_job(http, base, {"id": "train-1", "gpus": 4})
        assert status == 200
        again = msgspec.json.decode(body, type=SubmitResponse)
        assert again.duplicate and again.job.gpus == 2.0  # the existing job, not the new body
        assert await stream_count(bus, subjects.STREAM_JOBS, subjects.SUBJECT_SUBMIT) == 1
        assert await stream_count(bus, subjects.STREAM_LIFECYCLE) == 1


async def test_submit_without_id_gets_one(nats_url, bus, http):
    async with gateway(nats_url) as base:
        ids = set()
        for _ in range(2):
            status, body = await post_job(http, base, {"gpus": 1})
            assert status == 201, body
            ids.add(msgspec.json.decode(body, type=SubmitResponse).job.id)
        assert len(ids) == 2 and all(i.startswith("j-") for i in ids)
        assert await stream_count(bus, subjects.STREAM_JOBS) == 2


async def test_invalid_submissions_name_the_field_and_publish_nothing(nats_url, bus, http):
    cases: list[tuple[Any, str]] = [
        (b'{"id": "x", "gpus": ', "body"),
        (b"[1, 2]", "body"),
        ({"id": "a", "gpus": -1}, "gpus"),
        ({"id": "b", "gpus": "many"}, "gpus"),
        ({"id": "c", "gpu_mem_gb": 40, "constraints": ["t4"]}, "gpu_mem_gb"),
        ({"id": "d", "constraints": ["tpu-v9"]}, "constraints"),
        ({"id": "e", "deadline": time.time() - 3600}, "deadline"),
        ({"id": "f", "energy_sensitivity": 1.5}, "energy_sensitivity"),
    ]
    async with gateway(nats_url) as base:
        for body, field in cases:
            status, raw = await post_job(http, base, body)
            assert status == 400, (body, raw)
            err = msgspec.json.decode(raw, type=ErrorResponse)
            assert field in [e.field for e in err.errors], (body, err)
            assert all(e.reason for e in err.errors)
        assert await stream_count(bus, subjects.STREAM_JOBS) == 0
        assert await stream_count(bus, subjects.STREAM_LIFECYCLE) == 0
        async with http.get(f"{base}/v1/jobs") as r:
            assert (await r.json())["jobs"] == []


async def test_a_job_no_node_can_ever_hold_is_refused_with_the_reason(nats_url, bus, http):
    cluster = demo_cluster()
    nodes_kv = await bus.kv(subjects.KV_NODES, NodeSpec)
    for node in cluster:
        await nodes_kv.put(node.id, node)
    async with gateway(nats_url) as base:

        async def all_nodes() -> bool:
            async with http.get(f"{base}/v1/nodes") as r:
                return len((await r.json())["nodes"]) == len(cluster)

        await until(all_nodes, "the gateway sees every node")
        status, raw = await post_job(http, base, {"id": "huge", "gpus": 48})  # not a gang either
        assert status == 400, raw
        err = msgspec.json.decode(raw, type=ErrorResponse)
        assert [e.field for e in err.errors] == ["gpus"]
        assert "no node" in err.errors[0].reason and "48" in err.errors[0].reason

        # 70 GB per GPU with 300 GB of host memory: each node fails on something different
        status, raw = await post_job(
            http, base, {"id": "fat", "gpus": 2, "gpu_mem_gb": 70, "host_mem_gb": 300}
        )
        assert status == 400, raw
        assert "no node" in msgspec.json.decode(raw, type=ErrorResponse).errors[0].reason

        status, raw = await post_job(http, base, {"id": "fits", "gpus": 8, "gpu_mem_gb": 70})
        assert status == 201, raw  # a whole A100 node holds it
        assert await stream_count(bus, subjects.STREAM_JOBS) == 1


# --- read model ---------------------------------------------------------------------------------


async def test_read_model_follows_lifecycle_and_survives_a_restart(nats_url, bus, http):
    async with gateway(nats_url) as base:
        for job_id, tenant in (("r-1", "nlp"), ("r-2", "vision")):
            status, _ = await post_job(http, base, {"id": job_id, "tenant": tenant, "gpus": 2})
            assert status == 201
        await publish_event(bus, Placed(job_id="r-1", time=10.0, node="a100-0", attempt=1))

        async def placed() -> bool:
            job = await get_job(http, base, "r-1")
            return job is not None and job.state == "placed"

        await until(placed, "r-1 placed")
        await publish_event(bus, Started(job_id="r-1", time=11.0, node="a100-0"))
        await publish_event(bus, Completed(job_id="r-1", time=20.0, node="a100-0"))

        async def completed() -> JobView | None:
            job = await get_job(http, base, "r-1")
            return job if job is not None and job.state == "completed" else None

        done = await until(completed, "r-1 completed")
        assert (done.node, done.start_time, done.end_time, done.attempts) == (
            "a100-0",
            11.0,
            20.0,
            1,
        )
        async with http.get(f"{base}/v1/jobs", params={"state": "pending"}) as r:
            assert [j["id"] for j in (await r.json())["jobs"]] == ["r-2"]
        async with http.get(f"{base}/v1/jobs", params={"tenant": "nlp"}) as r:
            assert [j["id"] for j in (await r.json())["jobs"]] == ["r-1"]
        async with http.get(f"{base}/v1/jobs", params={"state": "sleeping"}) as r:
            assert r.status == 400
        async with http.get(f"{base}/v1/jobs/r-1/events") as r:
            kinds = [e["type"] for e in (await r.json())["events"]]
        assert kinds == ["submitted", "placed", "started", "completed"]
        async with http.get(f"{base}/v1/jobs/nope") as r:
            assert r.status == 404
            assert msgspec.json.decode(await r.read(), type=ErrorResponse).error
        async with http.get(f"{base}/v1/jobs") as r:
            before = (await r.json())["jobs"]

    async with gateway(nats_url) as base:  # a new process: everything from the stream again
        async with http.get(f"{base}/v1/jobs") as r:
            assert (await r.json())["jobs"] == before
        status, body = await post_job(http, base, {"id": "r-1", "gpus": 1})
        assert status == 200 and msgspec.json.decode(body, type=SubmitResponse).duplicate
    assert await stream_count(bus, subjects.STREAM_JOBS) == 2


async def test_cancel_publishes_a_request_and_refuses_unknown_or_finished(nats_url, bus, http):
    async with gateway(nats_url) as base:
        for job_id in ("c-1", "c-2"):
            assert (await post_job(http, base, {"id": job_id}))[0] == 201
        async with http.delete(f"{base}/v1/jobs/c-1") as r:
            assert r.status == 202
            assert await r.json() == {"job_id": "c-1", "status": "cancelling"}
        raw = await bus.js.get_last_msg(subjects.STREAM_JOBS, subjects.SUBJECT_CANCEL)
        assert msgspec.json.decode(raw.data, type=CancelRequest).job_id == "c-1"

        async with http.delete(f"{base}/v1/jobs/ghost") as r:
            assert r.status == 404
        await publish_event(bus, Completed(job_id="c-2", time=5.0))

        async def finished() -> bool:
            job = await get_job(http, base, "c-2")
            return job is not None and job.state == "completed"

        await until(finished, "c-2 completed")
        async with http.delete(f"{base}/v1/jobs/c-2") as r:
            assert r.status == 409
        assert await stream_count(bus, subjects.STREAM_JOBS, subjects.SUBJECT_CANCEL) == 1


async def test_garbage_on_lifecycle_goes_to_dlq_and_the_gateway_keeps_serving(nats_url, bus, http):
    async with gateway(nats_url) as base:
        assert (await post_job(http, base, {"id": "g-1"}))[0] == 201
        await bus.js.publish(subjects.lifecycle("g-1"), b"\x00 not an event")
        await bus.js.publish(subjects.lifecycle("g-1"), b'{"type": "exploded", "job_id": "g-1"}')
        await publish_event(bus, Placed(job_id="g-1", time=3.0, node="t4-0"))

        async def placed() -> bool:
            job = await get_job(http, base, "g-1")
            return job is not None and job.state == "placed"

        await until(placed, "the good event after the garbage is applied")
        assert await until(
            lambda: _count_at_least(bus, subjects.STREAM_DLQ, subjects.dlq("gateway"), 2),
            "two dead letters",
        )
        raw = await bus.js.get_last_msg(subjects.STREAM_DLQ, subjects.dlq("gateway"))
        letter = msgspec.json.decode(raw.data, type=DeadLetter)
        assert letter.service == "gateway" and letter.subject == subjects.lifecycle("g-1")
        assert letter.reason


async def _count_at_least(bus: Bus, stream: str, subject: str, n: int) -> bool:
    return await stream_count(bus, stream, subject) >= n


# --- nodes, health, metrics, dashboard ----------------------------------------------------------


async def test_nodes_join_spec_ledger_and_telemetry(nats_url, bus, http):
    node = demo_cluster()[0]
    cordoned = msgspec.structs.replace(demo_cluster()[-1], labels={"cordoned": "true"})
    nodes_kv = await bus.kv(subjects.KV_NODES, NodeSpec)
    await nodes_kv.put(node.id, node)
    await nodes_kv.put(cordoned.id, cordoned)
    ledger = await bus.kv(subjects.KV_LEDGER, Allocation)
    for job_id, gpus in (("n-1", (0, 1)), ("n-2", (2,))):
        await ledger.put(
            job_id,
            Allocation(
                job_id=job_id,
                node=node.id,
                gpu_indices=gpus,
                gpu_share=1.0,
                gpu_mem_gb=20.0,
                host_mem_gb=32.0,
                cpus=4.0,
                time=1.0,
            ),
        )
    async with gateway(nats_url) as base:
        sample = TelemetrySample(
            node=node.id,
            time=5.0,
            backend="sim",
            gpus=(GpuSample(index=0, util=0.9, mem_used_gb=30.0, temp_c=71.0, power_w=350.0),),
        )

        async def view() -> dict[str, NodeView] | None:
            async with http.get(f"{base}/v1/nodes") as r:
                body = await r.read()
            views = msgspec.json.decode(body, type=dict[str, list[NodeView]])["nodes"]
            by_id = {v.spec.id: v for v in views}
            ok = len(by_id) == 2 and by_id[node.id].jobs == ("n-1", "n-2")
            return by_id if ok else None

        by_id = await until(view, "both nodes with their allocations")

        async def sampled() -> NodeView | None:
            await bus.publish(subjects.telemetry(node.id), sample, durable=False)
            got = await view()
            return got[node.id] if got and got[node.id].telemetry is not None else None

        assert (await until(sampled, "the telemetry sample")).telemetry == sample
        a100 = by_id[node.id]
        assert (a100.gpus_allocated, a100.gpu_mem_allocated_gb, a100.host_mem_allocated_gb) == (
            3.0,
            60.0,
            64.0,
        )
        assert not a100.cordoned and by_id[cordoned.id].cordoned
        await ledger.delete("n-2")

        async def freed() -> bool:
            async with http.get(f"{base}/v1/nodes") as r:
                views = (await r.json())["nodes"]
            return any(v["spec"]["id"] == node.id and v["jobs"] == ["n-1"] for v in views)

        await until(freed, "the freed allocation disappears")

        async with http.get(f"{base}/") as r:
            assert r.status == 200 and "text/html" in r.headers["Content-Type"]
            page = await r.text()
        assert node.id in page and "refresh" in page


async def test_healthz_and_metrics(nats_url, http):
    async with gateway(nats_url) as base:
        async with http.get(f"{base}/healthz") as r:
            body = await r.json()
            assert r.status == 200 and body["status"] == "ok"
            # the Mosaic clock, which clients use for relative deadlines
            assert abs(body["now"] - time.time()) < 60 and body["clock_factor"] == 1
        await post_job(http, base, {"id": "m-1"})
        await post_job(http, base, {"id": "m-1"})
        await post_job(http, base, {"id": "m-2", "gpus": -3})
        async with http.get(f"{base}/metrics") as r:
            assert r.status == 200
            text = await r.text()
    for outcome in ("accepted", "duplicate", "refused"):
        assert f'mosaic_gateway_submissions_total{{outcome="{outcome}"}}' in text
    assert 'mosaic_gateway_http_request_seconds_count{method="POST",route="/v1/jobs"' in text
    assert 'mosaic_gateway_jobs{state="pending"}' in text


# --- the fold and the page, without NATS --------------------------------------------------------


def test_fold_state_machine_and_idempotence():
    m = JobsModel()
    spec = JobSpec(id="f-1", tenant="t", gpus=2, submit_time=1.0)
    assert not m.apply(Placed(job_id="ghost", time=1.0, node="n"))  # no Submitted: orphan
    assert m.orphans == 1 and "ghost" not in m
    sub = Submitted(job_id="f-1", time=1.0, spec=spec)
    assert m.apply(sub) and not m.apply(sub)  # our own echo / a redelivery changes nothing
    m.apply(Queued(job_id="f-1", time=2.0, reason="Resources", score=0.7))
    job = m.get("f-1")
    assert (job.state, job.reason, job.score) == ("pending", "Resources", 0.7)
    m.apply(Placed(job_id="f-1", time=3.0, node="a", attempt=1))
    m.apply(Started(job_id="f-1", time=4.0, node="a", attempt=1))
    m.apply(Preempted(job_id="f-1", time=5.0, node="a", reason="defrag"))
    assert (job.state, job.node, job.reason) == ("pending", None, "defrag")
    m.apply(Placed(job_id="f-1", time=6.0, node="b", attempt=2))
    m.apply(Started(job_id="f-1", time=7.0, node="b", attempt=2))
    assert (job.state, job.node, job.attempts, job.start_time) == ("running", "b", 2, 4.0)
    m.apply(Failed(job_id="f-1", time=8.0, node="b", reason="OOM"))
    assert not m.apply(Cancelled(job_id="f-1", time=9.0))  # a job ends exactly once
    assert (job.state, job.reason, job.end_time) == ("failed", "OOM", 8.0)
    assert len(m.events("f-1")) == 8
    assert m.list(state="failed") == [job] and m.list(tenant="other") == []


def test_dashboard_escapes_what_users_wrote():
    m = JobsModel()
    m.apply(Submitted(job_id="x", time=1.0, spec=JobSpec(id="x")))
    m.apply(Failed(job_id="x", time=2.0, reason="<script>alert(1)</script>"))
    page = render([], m.list(), m.counts())
    assert "<script>" not in page and "&lt;script&gt;" in page
