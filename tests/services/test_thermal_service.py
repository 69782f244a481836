"""services/thermal on a real nats-server: telemetry in, intents and audit records out, bad
telemetry dead-lettered while the guard keeps running."""

from __future__ import annotations

import asyncio
import json
import random
import time

import msgspec
from prometheus_client import REGISTRY

from libs.clock import Clock
from proto import subjects
from proto.decisions import DeadLetter, Decision
from proto.intents import HOLD_HOT, HoldIntent, Intent, MoveIntent
from proto.jobs import JobSpec
from proto.ledger import Allocation
from proto.nodes import GpuSample, NodeSpec, TelemetrySample
from services.thermal.service import main
from tests.obs._spans import OtlpReceiver, exporting_to
from tests.services._scorer_util import connect, poll, put_nodes, start_in_process

NODE = NodeSpec(
    id="a100-0",
    gpu_model="a100-80gb",
    gpu_count=4,
    gpu_mem_gb=80,
    host_mem_gb=512,
    cpus=64,
    idle_power_w=55,
    max_power_w=400,
)


# an empty node beside it: a moved job must have somewhere to resume (the placer's rule)
SPARE = msgspec.structs.replace(NODE, id="a100-1")


def alloc(job: str, gpus: tuple[int, ...], spec: JobSpec) -> Allocation:
    return Allocation(
        job_id=job,
        node=NODE.id,
        gpu_indices=gpus,
        gpu_share=1.0,
        gpu_mem_gb=10,
        host_mem_gb=8,
        cpus=4,
        time=0.0,
        attempt=1,
        spec=spec,
    )


def sample(t: float, temps: list[float], node: str = NODE.id) -> TelemetrySample:
    gpus = tuple(
        GpuSample(index=i, util=0.9, mem_used_gb=10, temp_c=c, power_w=350)
        for i, c in enumerate(temps)
    )
    return TelemetrySample(node=node, time=t, backend="sim", gpus=gpus)


def latency_count(intent: str) -> float:
    v = REGISTRY.get_sample_value(
        "mosaic_thermal_detection_to_intent_seconds_count", {"intent": intent}
    )
    return v or 0.0


async def test_hot_node_is_held_its_movable_job_migrated_and_released_after_cooling(nats_url):
    with OtlpReceiver() as receiver:
        with exporting_to(receiver):
            intents, decisions = await _hot_then_cool(nats_url)
        spans = list(receiver.spans)  # flushed on leaving exporting_to, over real OTLP/HTTP
    # each decision explains itself: a span per intent, in the trace its audit record names
    hold_span = next(s for s in spans if s.name == "thermal.hold")
    move_span = next(s for s in spans if s.name == "thermal.migrate")
    assert hold_span.attributes["node"] == NODE.id
    assert move_span.attributes["job"] == "ckpt"
    assert hold_span.attributes["detection_to_intent_s"] >= 10.0
    assert decisions[0].trace_id == hold_span.trace_id
    assert intents[1].trace.startswith(f"00-{move_span.trace_id}-{move_span.span_id}-")
    assert any(s.name == "thermal.release" for s in spans)


async def _hot_then_cool(nats_url: str) -> tuple[list[Intent], list[Decision]]:
    bus = await connect(nats_url)
    intents: list[Intent] = []
    decisions: list[Decision] = []
    letters: list[DeadLetter] = []

    async def on_intent(i: Intent) -> None:
        intents.append(i)

    async def on_decision(d: Decision) -> None:
        decisions.append(d)

    async def on_letter(d: DeadLetter) -> None:
        letters.append(d)

    await bus.subscribe(subjects.intents("thermal"), Intent, on_intent)
    await bus.subscribe(subjects.decisions("thermal"), Decision, on_decision)
    await bus.subscribe(subjects.dlq("thermal"), DeadLetter, on_letter)
    await put_nodes(bus, [NODE, SPARE])
    ledger = await bus.kv(subjects.KV_LEDGER, Allocation)
    movable = JobSpec(id="ckpt", checkpointable=True)
    fixed = JobSpec(id="fixed")  # neither checkpointable nor elastic: never moved
    serving = JobSpec(id="serve", checkpointable=True, kind="inference")
    await ledger.put("ckpt", alloc("ckpt", (1,), movable))
    await ledger.put("fixed", alloc("fixed", (2,), fixed))
    await ledger.put("serve", alloc("serve", (3,), serving))

    clock = Clock(epoch=time.time(), factor=1.0)
    svc = start_in_process("thermal", main, nats_url, clock=clock)
    before = latency_count("hold")
    try:
        await asyncio.sleep(1.0)  # its watches and subscription settle
        # undecodable telemetry: dead-lettered, and the guard goes on
        await bus.nc.publish(subjects.telemetry(NODE.id), b'{"node": 1}')
        # decodable but unsound (a -300 C reading): refused, not counted toward a window
        bad = sample(clock.now() - 20, [-300.0, 20.0, 20.0, 20.0])
        await bus.publish(subjects.telemetry(NODE.id), bad, durable=False)
        t0 = clock.now() - 10.0
        hot = [60.0, 70.0, 96.0, 97.0]  # GPU 3 is the hottest, but its job is inference
        for k in range(3):
            await bus.publish(subjects.telemetry(NODE.id), sample(t0 + 5 * k, hot), durable=False)
        await poll(lambda: _async(len(intents) >= 2), timeout_s=10)
        hold, move = intents[:2]
        assert isinstance(hold, HoldIntent) and hold.on and hold.hold == HOLD_HOT
        assert hold.node == NODE.id and hold.ttl_s >= 60 and hold.source == "thermal"
        assert hold.trace.startswith("00-")
        assert isinstance(move, MoveIntent) and move.kind == "migrate"
        assert (move.job_id, move.attempt, move.node) == ("ckpt", 1, NODE.id)
        await poll(lambda: _async(len(decisions) >= 2), timeout_s=10)
        assert [d.action for d in decisions[:2]] == ["cordon", "migrate"]
        assert decisions[0].intent == hold.id and decisions[1].intent == move.id
        assert decisions[1].job_id == "ckpt" and decisions[1].trace_id
        assert letters and letters[0].service == "thermal"
        assert latency_count("hold") == before + 1
        detect_s = REGISTRY.get_sample_value(
            "mosaic_thermal_detection_to_intent_seconds_sum", {"intent": "hold"}
        )
        assert detect_s is not None and detect_s >= 10.0  # from the window's first sample

        cold = [40.0] * 4
        for k in range(3, 6):
            await bus.publish(subjects.telemetry(NODE.id), sample(t0 + 5 * k, cold), durable=False)
        await poll(lambda: _async(len(intents) >= 3), timeout_s=10)
        release = intents[2]
        assert isinstance(release, HoldIntent) and not release.on
        assert release.ttl_s > 0  # the placer refuses any hold intent without a positive TTL
        # nothing but the one movable job was ever asked to move
        moved = {i.job_id for i in intents if isinstance(i, MoveIntent)}
        assert moved == {"ckpt"}
        # the intents are in the INTENTS stream under their ids (the placer's durable source)
        info = await bus.js.stream_info(subjects.STREAM_INTENTS)
        assert info.state.messages == len(intents)
    finally:
        assert await svc.close() == 0
        await bus.close()
    return intents, decisions


async def test_a_restarted_guard_asks_the_same_move_once(nats_url):
    """Intent ids are deterministic: a guard restarted on the same hot window repeats its
    intents, and JetStream's duplicate window keeps one of each."""
    bus = await connect(nats_url)
    await put_nodes(bus, [NODE, SPARE])
    ledger = await bus.kv(subjects.KV_LEDGER, Allocation)
    await ledger.put("ckpt", alloc("ckpt", (0,), JobSpec(id="ckpt", checkpointable=True)))
    clock = Clock(epoch=time.time(), factor=1.0)
    t0 = clock.now()
    for _ in range(2):
        svc = start_in_process("thermal", main, nats_url, clock=clock)
        try:
            await asyncio.sleep(1.0)
            for k in range(3):
                s = sample(t0 + 5 * k, [99.0, 50.0, 50.0, 50.0])
                await bus.publish(subjects.telemetry(NODE.id), s, durable=False)

            async def two() -> bool:
                info = await bus.js.stream_info(subjects.STREAM_INTENTS)
                return info.state.messages >= 2

            await poll(two, timeout_s=10)
        finally:
            assert await svc.close() == 0
    info = await bus.js.stream_info(subjects.STREAM_INTENTS)
    assert info.state.messages == 2  # one hold, one move: the repeats were dropped
    msg = await bus.js.get_last_msg(subjects.STREAM_INTENTS, subjects.intents("thermal"))
    assert isinstance(msgspec.json.decode(msg.data, type=Intent), MoveIntent)
    await bus.close()


async def _async(value: object) -> object:
    return value


async def test_no_move_is_asked_that_the_placers_rule_refuses(nats_url):
    """One node only: a moved job could not resume anywhere within its bound, so the guard
    holds the node but asks no move (stages.preempt, the placer's own rule)."""
    bus = await connect(nats_url)
    await put_nodes(bus, [NODE])
    ledger = await bus.kv(subjects.KV_LEDGER, Allocation)
    await ledger.put("ckpt", alloc("ckpt", (0,), JobSpec(id="ckpt", checkpointable=True)))
    clock = Clock(epoch=time.time(), factor=1.0)
    svc = start_in_process("thermal", main, nats_url, clock=clock)
    try:
        await asyncio.sleep(1.0)
        t0 = clock.now()
        for k in range(3):
            s = sample(t0 + 5 * k, [99.0, 50.0, 50.0, 50.0])
            await bus.publish(subjects.telemetry(NODE.id), s, durable=False)

        async def held() -> bool:
            info = await bus.js.stream_info(subjects.STREAM_INTENTS)
            return info.state.messages >= 1

        await poll(held, timeout_s=10)
        await asyncio.sleep(0.5)
        info = await bus.js.stream_info(subjects.STREAM_INTENTS)
        assert info.state.messages == 1  # the hold alone
        msg = await bus.js.get_last_msg(subjects.STREAM_INTENTS, subjects.intents("thermal"))
        assert isinstance(msgspec.json.decode(msg.data, type=Intent), HoldIntent)
    finally:
        assert await svc.close() == 0
        await bus.close()


def _garbage(rng: random.Random, good: dict) -> bytes:
    """A telemetry payload broken one way or another (or fine but for an unsound value)."""
    s = json.loads(json.dumps(good))
    g = s["gpus"][rng.randrange(len(s["gpus"]))]
    pick = rng.randrange(9)
    if pick == 0:
        del s[rng.choice(["node", "time", "gpus", "backend"])]
    elif pick == 1:
        g["temp_c"] = rng.choice(["hot", None, [], {"c": 1}])
    elif pick == 2:
        g["temp_c"] = rng.choice([-300.0, 1e308, 201.0])
    elif pick == 3:
        g["index"] = rng.choice([-1, 4, 99, 2**40])
    elif pick == 4:
        s["gpus"] = s["gpus"] + s["gpus"]  # duplicate indices
    elif pick == 5:
        s["node"] = rng.choice(["", "a100-0.evil", "x" * 500, 7])
    elif pick == 6:
        return b"[" * 5000 + b"]" * 5000  # deeper than any decoder should go
    elif pick == 7:
        return json.dumps(s).encode().replace(b'"temp_c": 60.0', b'"temp_c": NaN')
    else:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    return json.dumps(s).encode()


async def test_garbage_telemetry_never_stops_the_guard(nats_url):
    """Two hundred broken samples: each refused or dead-lettered, none counted toward a
    window; the guard keeps running and still holds the node on a sound hot window."""
    bus = await connect(nats_url)
    await put_nodes(bus, [NODE, SPARE])
    holds: list[HoldIntent] = []

    async def on_intent(i: Intent) -> None:
        if isinstance(i, HoldIntent):
            holds.append(i)

    await bus.subscribe(subjects.intents("thermal"), Intent, on_intent)
    clock = Clock(epoch=time.time(), factor=1.0)
    svc = start_in_process("thermal", main, nats_url, clock=clock)
    rng = random.Random(14)
    try:
        await asyncio.sleep(1.0)
        t0 = clock.now()
        good = msgspec.to_builtins(sample(t0, [60.0, 99.0, 60.0, 60.0]))
        for k in range(200):
            good["time"] = t0 + k  # a sound one of these would have made the node hot
            await bus.nc.publish(subjects.telemetry(NODE.id), _garbage(rng, good))
        await asyncio.sleep(1.0)
        assert not svc.task.done() and holds == []
        for k in range(3):
            s = sample(t0 + 1000 + 5 * k, [60.0, 99.0, 60.0, 60.0])
            await bus.publish(subjects.telemetry(NODE.id), s, durable=False)
        await poll(lambda: _async(len(holds) >= 1), timeout_s=10)
        info = await bus.js.stream_info(subjects.STREAM_DLQ)
        assert info.state.messages > 0  # the undecodable ones, each with its reason
    finally:
        assert await svc.close() == 0
        await bus.close()
