"""Receive loops that never die (issue 12, item 1), on a real nats-server.

Each test sends what once stopped a service — a deeply nested message, a handler that always
raises, an undecodable KV value — then shows the loop still handles the next message, the bad one
is a dead letter, and ``/healthz`` tells the truth: 200 after garbage, 503 once a loop is gone.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client import REGISTRY

from libs.bus import Bus
from libs.bus.limits import DecodeLimits
from libs.obs.health import Health, ObsServer
from proto import subjects
from proto.decisions import DeadLetter
from proto.events import Completed, LifecycleEvent, Started
from proto.nodes import GpuSample, NodeSpec, TelemetrySample
from tests.bus.conftest import wait_for

NESTED_6KB = b'{"type":"started","job_id":"x","time":1,"x":' + b'{"a":' * 1000 + b"1" + b"}" * 1001
assert 6000 <= len(NESTED_6KB) <= 7000


async def dlq(bus: Bus) -> list[DeadLetter]:
    """Every dead letter ``bus`` writes from now on, as they arrive (read by a second loop)."""
    letters: list[DeadLetter] = []

    async def on_letter(d: DeadLetter) -> None:
        letters.append(d)

    await bus.consume(subjects.STREAM_DLQ, subjects.dlq(bus.service), DeadLetter, on_letter)
    return letters


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def settled(bus: Bus, stream: str, durable: str) -> None:
    """The consumer has nothing pending, unacked or waiting for redelivery."""

    async def state() -> tuple[int, int]:
        info = await bus.js.consumer_info(stream, durable)
        return info.num_ack_pending, info.num_pending

    for _ in range(250):
        if await state() == (0, 0):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"consumer {durable} still has work: {await state()}")


@pytest.mark.parametrize(
    "garbage", [b"[" * 100_000, NESTED_6KB], ids=["100k-brackets", "6KB-nested-object"]
)
async def test_deep_nesting_is_dead_lettered_and_next_message_handled(
    bus: Bus, garbage: bytes
) -> None:
    letters = await dlq(bus)
    got: list[LifecycleEvent] = []

    async def handler(ev: LifecycleEvent) -> None:
        got.append(ev)

    before = counter("mosaic_dead_letters_by_kind_total", service="test", kind="too_deep")
    await bus.js.publish("lifecycle.x", garbage)
    await bus.publish("lifecycle.y", Started(job_id="y", time=2.0))
    await bus.consume(
        subjects.STREAM_LIFECYCLE, "lifecycle.>", LifecycleEvent, handler, durable="d"
    )
    await wait_for(lambda: len(got) == 1 and len(letters) == 1, what="next event + dead letter")
    assert got[0].job_id == "y"
    assert letters[0].subject == "lifecycle.x"
    assert "too deep" in letters[0].reason
    assert letters[0].data == garbage[: len(letters[0].data)]
    assert counter("mosaic_dead_letters_by_kind_total", service="test", kind="too_deep") == (
        before + 1
    )
    await settled(bus, subjects.STREAM_LIFECYCLE, "d")  # terminated, not left for redelivery
    assert bus.health.report()[0] == 200, bus.health.problems()


async def test_recursion_error_in_the_decoder_itself_is_dead_lettered(nats_url: str) -> None:
    # with the depth scan out of the way, msgspec raises RecursionError: still a dead letter
    bus = await Bus.connect(nats_url, "deep")
    bus.limits = DecodeLimits(max_depth=10**6)
    try:
        await bus.ensure_topology()
        letters = await dlq(bus)
        got: list[TelemetrySample] = []

        async def handler(s: TelemetrySample) -> None:
            got.append(s)

        await bus.subscribe(subjects.TELEMETRY_ALL, TelemetrySample, handler)
        await bus.nc.publish("telemetry.n1", b'{"node": "n1", "x":' + b"[" * 5000 + b"]" * 5000)
        sample = TelemetrySample(node="n2", time=1.0, backend="sim", gpus=())
        await bus.publish("telemetry.n2", sample, durable=False)
        await wait_for(lambda: got == [sample] and len(letters) == 1, what="sample + letter")
        assert "RecursionError" in letters[0].reason
        assert bus.health.healthy(), bus.health.problems()
    finally:
        await bus.close()


@pytest.mark.parametrize("exc", [RuntimeError("boom"), RecursionError("deep handler")])
async def test_handler_that_always_raises_is_terminated_after_max_deliver(
    bus: Bus, exc: Exception
) -> None:
    letters = await dlq(bus)
    calls: list[str] = []

    async def handler(ev: LifecycleEvent) -> None:
        calls.append(ev.job_id)
        if ev.job_id == "bad":
            raise exc

    await bus.publish("lifecycle.bad", Completed(job_id="bad", time=1.0))
    await bus.publish("lifecycle.good", Completed(job_id="good", time=2.0))
    await bus.consume(
        subjects.STREAM_LIFECYCLE,
        "lifecycle.>",
        LifecycleEvent,
        handler,
        durable="h",
        max_deliver=3,
        retry_delay_s=0.01,
    )
    await wait_for(lambda: "good" in calls and len(letters) == 1, what="good + dead letter")
    assert calls.count("bad") == 3
    assert "handler failed 3 times" in letters[0].reason and str(exc) in letters[0].reason
    await settled(bus, subjects.STREAM_LIFECYCLE, "h")  # the stream is not wedged
    await bus.publish("lifecycle.later", Completed(job_id="later", time=3.0))
    await wait_for(lambda: "later" in calls, what="a message after the dead letter")
    assert calls.count("bad") == 3 and len(letters) == 1
    assert bus.health.healthy(), bus.health.problems()


async def test_core_subscription_survives_garbage_and_failing_handler(bus: Bus) -> None:
    letters = await dlq(bus)
    got: list[str] = []

    async def handler(s: TelemetrySample) -> None:
        if s.node == "explode":
            raise ValueError("bad sample" + "!" * 100_000)  # a reason of any length
        got.append(s.node)

    def sample(node: str) -> TelemetrySample:
        gpu = GpuSample(index=0, util=0.1, mem_used_gb=1.0, temp_c=40.0, power_w=50.0)
        return TelemetrySample(node=node, time=1.0, backend="sim", gpus=(gpu,))

    await bus.subscribe(subjects.TELEMETRY_ALL, TelemetrySample, handler)
    for garbage in (b"[" * 100_000, b"", b"\xff\xfe not utf-8", b'{"node": 1e999}'):
        await bus.nc.publish("telemetry.junk", garbage)
    await bus.publish("telemetry.explode", sample("explode"), durable=False)
    await bus.publish("telemetry.ok", sample("ok"), durable=False)
    await wait_for(lambda: got == ["ok"] and len(letters) == 5, what="ok sample + 5 letters")
    reasons = [d.reason for d in letters]
    assert reasons[0].startswith("too deep")
    assert all(r.startswith("decode") for r in reasons[1:4])
    assert reasons[4].startswith("handler failed") and "bad sample" in reasons[4]
    assert len(reasons[4]) <= 2001
    assert bus.health.report()[0] == 200, bus.health.problems()


async def test_oversized_message_is_dead_lettered_with_its_data_cut(nats_url: str) -> None:
    bus = await Bus.connect(nats_url, "big")
    bus.limits = DecodeLimits(max_bytes=100_000)
    try:
        await bus.ensure_topology()
        letters = await dlq(bus)
        got: list[LifecycleEvent] = []

        async def handler(ev: LifecycleEvent) -> None:
            got.append(ev)

        await bus.consume(subjects.STREAM_LIFECYCLE, "lifecycle.>", LifecycleEvent, handler)
        huge = b'{"type":"started","job_id":"j","time":1,"reason":"' + b"r" * 900_000 + b'"}'
        await bus.js.publish("lifecycle.j", huge)
        await bus.publish("lifecycle.k", Started(job_id="k", time=1.0))
        await wait_for(lambda: len(got) == 1 and len(letters) == 1, what="event + letter")
        assert letters[0].reason.startswith(f"too large: {len(huge)} bytes > limit 100000")
        assert "data cut to 65536" in letters[0].reason
        assert letters[0].data == huge[:65536]
    finally:
        await bus.close()


def node(node_id: str) -> NodeSpec:
    return NodeSpec(
        id=node_id,
        gpu_model="T4",
        gpu_count=1,
        gpu_mem_gb=16.0,
        host_mem_gb=64.0,
        cpus=8,
        idle_power_w=10.0,
        max_power_w=70.0,
    )


async def test_kv_watch_survives_undecodable_values_and_failing_handler(bus: Bus) -> None:
    letters = await dlq(bus)
    kv = await bus.kv(subjects.KV_NODES, NodeSpec)
    seen: list[str] = []

    async def on_node(key: str, spec: NodeSpec | None) -> None:
        if key == "explode":
            raise RuntimeError("handler bug")
        seen.append(key)

    await kv.watch(on_node)
    await kv.raw.put("deep", b"[" * 100_000)
    await kv.raw.put("junk", b"\xff not a node")
    await kv.put("explode", node("explode"))
    await kv.put("n1", node("n1"))
    await wait_for(lambda: seen == ["n1"] and len(letters) == 3, what="n1 + 3 letters")
    assert [d.subject for d in letters] == ["$KV.nodes.deep", "$KV.nodes.junk", "$KV.nodes.explode"]
    assert letters[0].reason.startswith("too deep") and letters[1].reason.startswith("decode")
    assert "handler bug" in letters[2].reason
    assert bus.health.report()[0] == 200, bus.health.problems()


async def test_a_loop_killed_from_outside_makes_health_503(bus: Bus) -> None:
    async def handler(ev: LifecycleEvent) -> None:
        return None

    consumer = await bus.consume(subjects.STREAM_LIFECYCLE, "lifecycle.>", LifecycleEvent, handler)
    kv = await bus.kv(subjects.KV_NODES, NodeSpec)
    watch = await kv.watch(lambda k, v: asyncio.sleep(0))
    await bus.subscribe(subjects.TELEMETRY_ALL, TelemetrySample, lambda s: asyncio.sleep(0))
    assert bus.health.report()[0] == 200
    ended = counter("mosaic_receive_loops_ended_total", service="test", loop="kv-watch:nodes:>")

    consumer.task.cancel()
    watch.task.cancel()
    sub_monitor = bus._monitors["subscribe:telemetry.*"]
    assert sub_monitor.task is not None
    sub_monitor.task.cancel()
    await wait_for(lambda: len(bus.health.problems()) == 3, what="three dead loops reported")
    status, body = bus.health.report()
    assert status == 503 and b"unhealthy" in body
    problems = bus.health.problems()
    assert "died" in problems["consume:LIFECYCLE:lifecycle.>"]
    assert "cancelled" in problems["kv-watch:nodes:>"]
    assert "subscribe:telemetry.*" in problems
    assert counter("mosaic_receive_loops_ended_total", service="test", loop="kv-watch:nodes:>") == (
        ended + 1
    )


async def test_stop_unsubscribe_and_close_end_loops_quietly(nats_url: str) -> None:
    bus = await Bus.connect(nats_url, "quiet")
    await bus.ensure_topology()
    health = Health("quiet")
    bus.health = health  # as serve() does: checks of later loops land here

    async def nothing(_: object) -> None:
        return None

    consumer = await bus.consume(subjects.STREAM_LIFECYCLE, "lifecycle.>", LifecycleEvent, nothing)
    sub = await bus.subscribe(subjects.TELEMETRY_ALL, TelemetrySample, nothing)
    await bus.consume(subjects.STREAM_LIFECYCLE, "lifecycle.>", LifecycleEvent, nothing)
    assert {"consume:LIFECYCLE:lifecycle.>", "consume:LIFECYCLE:lifecycle.>#2"} <= set(
        health.report()[1].decode().split('"')
    )
    await consumer.stop()
    await sub.unsubscribe()
    await wait_for(lambda: "subscribe:telemetry.*" not in bus._monitors, what="sub loop ends")
    assert health.healthy(), health.problems()
    await bus.close()
    assert bus._monitors == {}
    assert set(health.problems()) == {"nats"}  # only the closed connection itself


async def test_health_handed_in_later_gets_the_checks_of_running_loops(bus: Bus) -> None:
    async def nothing(_: object) -> None:
        return None

    consumer = await bus.consume(subjects.STREAM_LIFECYCLE, "lifecycle.>", LifecycleEvent, nothing)
    later = Health("later")
    bus.health = later
    consumer.task.cancel()
    await wait_for(lambda: not later.healthy(), what="the new health sees the dead loop")
    assert "consume:LIFECYCLE:lifecycle.>" in later.problems()


async def test_connection_closed_under_a_loop_is_reported(bus: Bus) -> None:
    async def nothing(_: object) -> None:
        return None

    await bus.consume(subjects.STREAM_LIFECYCLE, "lifecycle.>", LifecycleEvent, nothing)
    await bus.nc.close()  # not Bus.close(): as if nats-py had given up
    await wait_for(
        lambda: "consume:LIFECYCLE:lifecycle.>" in bus.health.problems(), what="loop reported"
    )
    problems = bus.health.problems()
    assert problems["nats"] == "NATS connection closed"
    assert "NATS connection closed" in problems["consume:LIFECYCLE:lifecycle.>"]


async def test_wedged_handler_is_reported_idle_subscription_is_not(bus: Bus) -> None:
    release = asyncio.Event()
    entered = asyncio.Event()

    async def stuck(_: TelemetrySample) -> None:
        entered.set()
        await release.wait()

    await bus.subscribe(subjects.TELEMETRY_ALL, TelemetrySample, stuck, wedged_after_s=0.2)
    await bus.subscribe(subjects.LEDGER_UPDATED, TelemetrySample, stuck, wedged_after_s=0.2)
    await asyncio.sleep(0.4)  # quiet longer than wedged_after_s: idle is no fault
    assert bus.health.healthy(), bus.health.problems()
    sample = TelemetrySample(node="n", time=1.0, backend="sim", gpus=())
    await bus.publish("telemetry.n", sample, durable=False)
    await asyncio.wait_for(entered.wait(), 5)
    await wait_for(lambda: not bus.health.healthy(), what="wedged handler reported")
    assert "wedged" in bus.health.problems()["subscribe:telemetry.*"]
    release.set()
    await wait_for(bus.health.healthy, what="healthy again once the handler returns")


async def test_consumer_deleted_on_the_server_reports_wedged(bus: Bus) -> None:
    async def nothing(_: object) -> None:
        return None

    await bus.consume(
        subjects.STREAM_LIFECYCLE,
        "lifecycle.>",
        LifecycleEvent,
        nothing,
        durable="gone",
        wedged_after_s=1.0,
    )
    await bus.js.delete_consumer(subjects.STREAM_LIFECYCLE, "gone")
    # connected, yet every fetch fails: no progress, so unhealthy (a restart recreates it)
    await wait_for(
        lambda: "wedged" in bus.health.problems().get("consume:LIFECYCLE:lifecycle.>:gone", ""),
        timeout_s=20,
        what="deleted consumer reported",
    )


async def test_healthz_over_http_200_after_garbage_503_once_a_loop_is_killed(bus: Bus) -> None:
    server = ObsServer(bus.health, 0)
    url = f"http://127.0.0.1:{server.port}/healthz"

    def get() -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    got: list[str] = []

    async def handler(ev: LifecycleEvent) -> None:
        got.append(ev.job_id)

    try:
        consumer = await bus.consume(
            subjects.STREAM_LIFECYCLE, "lifecycle.>", LifecycleEvent, handler
        )
        await bus.js.publish("lifecycle.bad", NESTED_6KB)
        await bus.publish("lifecycle.ok", Started(job_id="ok", time=1.0))
        await wait_for(lambda: got == ["ok"], what="the event after the garbage")
        status, body = await asyncio.to_thread(get)
        assert status == 200 and body["status"] == "ok"
        assert "consume:LIFECYCLE:lifecycle.>" in body["checks"]
        consumer.task.cancel()
        await wait_for(lambda: not bus.health.healthy(), what="dead loop")
        status, body = await asyncio.to_thread(get)
        assert status == 503 and "consume:LIFECYCLE:lifecycle.>" in body["problems"]
    finally:
        server.close()
