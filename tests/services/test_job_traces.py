"""One trace per job across services (issue 13), exported over real OTLP/HTTP: a job submitted
through the HTTP gateway on a real NATS, ranked by the scorer, placed by the placer and run by
the sim executor, all in-process, yields submit -> score -> place -> start/run/complete in one
trace with the right parents; a job that waits many placer cycles gets few wait spans; a
malformed ``traceparent`` header on the bus makes a new root and no error."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from libs.bus import Bus
from proto.decisions import Decision
from proto.nodes import NodeSpec
from services.executor.service import main as executor_main
from services.placer.service import main as placer_main
from services.scorer.service import main as scorer_main
from tests.obs._spans import OtlpReceiver, captured, exporting_to, job_chain, one_span
from tests.services._scorer_util import poll, put_nodes, start_in_process
from tests.services.test_gateway import gateway, get_job, post_job

NODE = NodeSpec(
    id="t4-0",
    gpu_model="t4",
    gpu_count=4,
    gpu_mem_gb=16,
    host_mem_gb=128,
    cpus=32,
    idle_power_w=10,
    max_power_w=70,
)
FAST = {"tick_s": 0.3, "debounce_s": 0.02, "settle_s": 0.2, "lease_ttl_s": 2.0}


class _Explained(msgspec.Struct):
    decisions: list[Decision]


async def _state(http, base: str, job: str) -> str | None:
    view = await get_job(http, base, job)
    return view.state if view is not None else None


# make test-all; one trace per job across every process stays covered by
# tests/e2e/test_job_traces_stack.py
@pytest.mark.slow
async def test_a_job_is_one_trace_from_submission_to_completion(nats_url, bus, http, monkeypatch):
    monkeypatch.setenv("MOSAIC_WAIT_SPAN_EVERY_S", "60")
    await put_nodes(bus, [NODE])
    with OtlpReceiver() as receiver:
        with exporting_to(receiver):
            services = [
                start_in_process("scorer", scorer_main, nats_url, rescore_s=1.0, debounce_s=0.05),
                start_in_process("placer", placer_main, nats_url, **FAST),
                start_in_process(
                    "executor",
                    executor_main,
                    nats_url,
                    mode="sim",
                    node_spec=[msgspec.json.encode(NODE).decode()],
                    report_interval=0.5,
                ),
            ]
            try:
                async with gateway(nats_url) as base:
                    await _run_jobs(http, base)
            finally:
                codes = [await s.close() for s in services]
            assert codes == [0, 0, 0]
        spans = list(receiver.spans)  # the exporter was flushed on leaving exporting_to
    assert receiver.posts >= 1
    got = job_chain(spans, "traced")
    assert got["executor.complete"].attributes["attempt"] == 1
    # the waiter: many cycles of waiting, few wait spans, all in its own trace
    waiter = job_chain(spans, "waiter")
    waits = [s for s in spans if s.name == "placer.wait" and s.attributes.get("job") == "waiter"]
    reasons = {s.attributes["reason"] for s in waits}
    assert 1 <= len(waits) <= len(reasons) + 1, waits
    assert all(s.parent == waiter["gateway.submit"].span_id for s in waits)
    # the hog's cancel: decided by the placer, carried out by the executor, in the hog's trace
    hog_submit = one_span(spans, "gateway.submit", "hog")
    assert one_span(spans, "placer.cancel", "hog").parent == hog_submit.span_id
    hog = one_span(spans, "executor.cancel", "hog")
    assert hog.parent == one_span(spans, "placer.place", "hog").span_id


async def _run_jobs(http, base: str) -> None:
    async def node_seen() -> bool:
        async with http.get(f"{base}/v1/nodes") as r:
            return len((await r.json())["nodes"]) == 1

    await poll(node_seen)
    status, body = await post_job(http, base, {"id": "traced", "gpus": 1, "est_runtime_s": 1})
    assert status == 201, body
    await poll(lambda: _is(http, base, "traced", "completed"), timeout_s=30)
    # a job that holds the node, and one that waits behind it for many placer cycles
    status, body = await post_job(http, base, {"id": "hog", "gpus": 4, "est_runtime_s": 3600})
    assert status == 201, body
    await poll(lambda: _is(http, base, "hog", "running"), timeout_s=30)
    status, body = await post_job(http, base, {"id": "waiter", "gpus": 1, "est_runtime_s": 1})
    assert status == 201, body
    await asyncio.sleep(3.0)  # ~10 placer cycles with the waiter waiting
    assert await _state(http, base, "waiter") == "pending"
    async with http.get(f"{base}/v1/jobs/waiter/decisions") as r:
        explained = msgspec.json.decode(await r.read(), type=_Explained)
    waits = [d for d in explained.decisions if d.action == "wait"]
    assert waits and all(d.trace_id == waits[0].trace_id for d in waits)  # the job's trace id
    async with http.delete(f"{base}/v1/jobs/hog") as r:
        assert r.status in (200, 202), await r.text()
    await poll(lambda: _is(http, base, "waiter", "completed"), timeout_s=30)


async def _is(http, base: str, job: str, state: str) -> bool:
    return await _state(http, base, job) == state


async def test_a_malformed_traceparent_header_is_a_new_root_not_an_error(nats_url) -> None:
    bus = await Bus.connect(nats_url, "trace-test")
    got: list[NodeSpec] = []
    try:
        with captured() as exporter:

            async def handler(spec: NodeSpec) -> None:
                got.append(spec)

            await bus.subscribe("trace.test", NodeSpec, handler)
            data = msgspec.json.encode(NODE)
            for header in ("garbage", "00-" + "0" * 32 + "-" + "1" * 16 + "-01", "x" * 4000):
                await bus.nc.publish("trace.test", data, headers={"traceparent": header})
            await bus.nc.flush()
            await poll(lambda: asyncio.sleep(0, len(got) == 3))
        handled = [s for s in exporter.get_finished_spans() if s.name == "handle trace.test"]
        assert len(handled) == 3
        for span in handled:
            assert span.parent is None and span.context.is_valid  # a root of its own
            assert span.status.is_ok
    finally:
        await bus.close()
