"""Typed publish/subscribe, dead letters, dedupe and trace propagation on a real nats-server."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import REGISTRY

from libs.bus import Bus, BusUnavailable
from libs.bus.server import free_port
from libs.obs.tracing import current_trace_id, span_trace_id
from proto import subjects
from proto.decisions import DeadLetter
from proto.events import Completed, LifecycleEvent, Started, Submitted
from proto.jobs import JobSpec
from proto.nodes import GpuSample, TelemetrySample
from tests.bus.conftest import wait_for


def _sample(node: str, temp_c: float = 40.0) -> TelemetrySample:
    gpu = GpuSample(index=0, util=0.5, mem_used_gb=1.0, temp_c=temp_c, power_w=100.0)
    return TelemetrySample(node=node, time=1.0, backend="sim", gpus=(gpu,))


async def test_typed_round_trip_core(bus: Bus) -> None:
    got: list[TelemetrySample] = []

    async def handler(s: TelemetrySample) -> None:
        got.append(s)

    await bus.subscribe(subjects.TELEMETRY_ALL, TelemetrySample, handler)
    sent = _sample("n1", 55.5)
    await bus.publish(subjects.telemetry("n1"), sent, durable=False)
    await wait_for(lambda: len(got) == 1, what="telemetry sample")
    assert got[0] == sent


async def _dlq_letters(bus: Bus, service: str) -> list[DeadLetter]:
    letters: list[DeadLetter] = []

    async def on_letter(d: DeadLetter) -> None:
        letters.append(d)

    await bus.consume(subjects.STREAM_DLQ, subjects.dlq(service), DeadLetter, on_letter)
    return letters


def _dead_count(service: str, subject: str) -> float:
    v = REGISTRY.get_sample_value(
        "mosaic_dead_letters_total", {"service": service, "subject": subject}
    )
    return v or 0.0


async def test_garbage_goes_to_dlq_and_next_message_is_handled(bus: Bus) -> None:
    letters = await _dlq_letters(bus, bus.service)
    got: list[TelemetrySample] = []

    async def handler(s: TelemetrySample) -> None:
        got.append(s)

    before = _dead_count(bus.service, subjects.TELEMETRY_ALL)
    await bus.subscribe(subjects.TELEMETRY_ALL, TelemetrySample, handler)
    await bus.nc.publish(subjects.telemetry("n1"), b'{"node": 3, "nonsense": true')
    await bus.publish(subjects.telemetry("n2"), _sample("n2"), durable=False)
    await wait_for(lambda: len(got) == 1 and len(letters) == 1, what="good msg + dead letter")
    assert got[0].node == "n2"
    letter = letters[0]
    assert letter.service == bus.service
    assert letter.subject == "telemetry.n1"
    assert letter.data == b'{"node": 3, "nonsense": true'
    assert "decode" in letter.reason
    assert _dead_count(bus.service, subjects.TELEMETRY_ALL) == before + 1


async def test_garbage_on_durable_consumer_is_dead_lettered_and_acked(bus: Bus) -> None:
    letters = await _dlq_letters(bus, bus.service)
    got: list[LifecycleEvent] = []

    async def handler(ev: LifecycleEvent) -> None:
        got.append(ev)

    await bus.js.publish("lifecycle.j1", b'{"type": "nope", "job_id": "j1", "time": 1}')
    await bus.publish("lifecycle.j2", Started(job_id="j2", time=2.0, node="n1"))
    await bus.consume(
        subjects.STREAM_LIFECYCLE, "lifecycle.>", LifecycleEvent, handler, durable="t1"
    )
    await wait_for(lambda: len(got) == 1 and len(letters) == 1, what="event + dead letter")
    assert isinstance(got[0], Started)
    assert letters[0].subject == "lifecycle.j1"
    # the bad message was terminated, not left pending for redelivery
    for _ in range(100):
        info = await bus.js.consumer_info(subjects.STREAM_LIFECYCLE, "t1")
        if info.num_ack_pending == 0 and info.num_redelivered == 0:
            break
        await asyncio.sleep(0.02)
    assert info.num_ack_pending == 0
    assert info.num_redelivered == 0


async def test_handler_error_is_retried_then_dead_lettered(bus: Bus) -> None:
    letters = await _dlq_letters(bus, bus.service)
    calls: list[int] = []

    async def flaky(ev: LifecycleEvent) -> None:
        calls.append(1)
        if ev.job_id == "bad" or len(calls) == 1:
            raise RuntimeError("boom")

    await bus.publish("lifecycle.ok", Completed(job_id="ok", time=1.0))
    await bus.publish("lifecycle.bad", Completed(job_id="bad", time=1.0))
    await bus.consume(
        subjects.STREAM_LIFECYCLE,
        "lifecycle.>",
        LifecycleEvent,
        flaky,
        max_deliver=3,
        retry_delay_s=0.05,
    )
    await wait_for(lambda: len(letters) == 1, what="dead letter after retries")
    assert letters[0].subject == "lifecycle.bad"
    assert "failed 3 times" in letters[0].reason and "boom" in letters[0].reason
    # "ok" failed once, then succeeded; "bad" was tried exactly max_deliver times
    assert len(calls) == 2 + 3


async def test_same_msg_id_is_stored_once(bus: Bus) -> None:
    spec = JobSpec(id="j-dup")
    ev = Submitted(job_id="j-dup", time=1.0, spec=spec)
    first = await bus.publish(subjects.SUBJECT_SUBMIT, spec, msg_id="j-dup")
    second = await bus.publish(subjects.SUBJECT_SUBMIT, spec, msg_id="j-dup")
    third = await bus.publish(subjects.lifecycle("j-dup"), ev, msg_id="submitted-j-dup")
    assert (first, second, third) == (True, False, True)
    info = await bus.js.stream_info(subjects.STREAM_JOBS)
    assert info.state.messages == 1


async def test_durable_consumer_resumes_after_restart(nats_url: str) -> None:
    seen: list[str] = []

    async def handler(ev: LifecycleEvent) -> None:
        seen.append(ev.job_id)

    a = await Bus.connect(nats_url, "svc")
    await a.ensure_topology()
    await a.publish("lifecycle.a", Started(job_id="a", time=1.0))
    await a.consume(subjects.STREAM_LIFECYCLE, "lifecycle.>", LifecycleEvent, handler, durable="d")
    await wait_for(lambda: seen == ["a"], what="first event")
    await a.close()

    b = await Bus.connect(nats_url, "svc")
    await b.publish("lifecycle.b", Started(job_id="b", time=2.0))
    await b.consume(subjects.STREAM_LIFECYCLE, "lifecycle.>", LifecycleEvent, handler, durable="d")
    await wait_for(lambda: seen == ["a", "b"], what="only the new event after restart")
    await b.close()


async def test_trace_context_propagates_to_handler(bus: Bus) -> None:
    tracer = TracerProvider().get_tracer("test")
    handler_trace_ids: list[str | None] = []

    async def handler(ev: LifecycleEvent) -> None:
        handler_trace_ids.append(current_trace_id())

    await bus.consume(subjects.STREAM_LIFECYCLE, "lifecycle.>", LifecycleEvent, handler)
    with tracer.start_as_current_span("submit") as span:
        await bus.publish("lifecycle.t1", Started(job_id="t1", time=1.0))
        publisher_trace_id = span_trace_id(span)
    await wait_for(lambda: len(handler_trace_ids) == 1, what="handled event")
    assert publisher_trace_id is not None
    assert handler_trace_ids == [publisher_trace_id]


async def test_ensure_topology_twice_and_concurrently(nats_url: str) -> None:
    buses = [await Bus.connect(nats_url, f"s{i}") for i in range(3)]
    try:
        await asyncio.gather(*(b.ensure_topology() for b in buses))
        await buses[0].publish("lifecycle.x", Started(job_id="x", time=1.0))
        await buses[1].ensure_topology()  # a restart must not lose messages
        info = await buses[1].js.stream_info(subjects.STREAM_LIFECYCLE)
        assert info.state.messages == 1
        for name in subjects.STREAMS:
            await buses[2].js.stream_info(name)
        for bucket in subjects.KV_BUCKETS:
            await buses[2].js.key_value(bucket)
    finally:
        for b in buses:
            await b.close()


async def test_connect_gives_up_with_clear_error() -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    with pytest.raises(BusUnavailable, match=url):
        await Bus.connect(url, "x", attempts=2, delay_s=0.01)


def test_struct_encoding_is_plain_json() -> None:
    # what the bus puts on the wire is what other languages / the CLI can read
    data = msgspec.json.encode(Started(job_id="j", time=1.0))
    assert msgspec.json.decode(data)["type"] == "started"
