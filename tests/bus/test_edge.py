"""The payload limit at the edge and reconnection after a server error (issue 12, item 6).

What happened: a ~1 MB job made the placer's run command plus headers exceed the server's
max_payload; the server answered ``-ERR 'Maximum Payload Violation'`` and dropped the connection,
and nats-py closed the client for good. Now the bus refuses such a publish before sending it
(``PayloadTooLarge``), and a server error that still gets through reconnects like a lost socket.
"""

from __future__ import annotations

import nats
import pytest

from libs.bus import Bus
from libs.bus.errors import PayloadTooLarge
from libs.bus.limits import PAYLOAD_MARGIN_BYTES, header_size
from proto import subjects
from proto.events import LifecycleEvent, Started
from proto.jobs import JobSpec
from proto.nodes import NodeSpec, TelemetrySample
from tests.bus.conftest import wait_for


def sample(node: str) -> TelemetrySample:
    return TelemetrySample(node=node, time=1.0, backend="sim", gpus=())


@pytest.mark.parametrize("durable", [True, False], ids=["jetstream", "core"])
async def test_oversized_publish_is_refused_and_the_connection_stays(
    bus: Bus, durable: bool
) -> None:
    # under max_payload by itself (nats-py's own check passes), over it with the headers
    data = b"x" * (bus.nc.max_payload - 10)
    with pytest.raises(PayloadTooLarge) as err:
        await bus.publish_bytes("lifecycle.big", data, msg_id="big", durable=durable)
    assert "lifecycle.big" in str(err.value) and str(bus.max_publish_bytes()) in str(err.value)
    assert err.value.size > err.value.limit == bus.nc.max_payload - PAYLOAD_MARGIN_BYTES
    assert (await bus.js.stream_info(subjects.STREAM_LIFECYCLE)).state.messages == 0
    # the connection is untouched: no reconnect, and the next publish goes through
    assert bus.nc.is_connected and bus.nc.stats["reconnects"] == 0
    assert await bus.publish("lifecycle.ok", Started(job_id="ok", time=1.0))
    assert (await bus.js.stream_info(subjects.STREAM_LIFECYCLE)).state.messages == 1
    assert bus.health.healthy()


async def test_oversized_struct_and_kv_value_are_refused(bus: Bus) -> None:
    spec = JobSpec(id="huge", command="x" * bus.nc.max_payload)
    with pytest.raises(PayloadTooLarge, match=r"jobs\.submit"):
        await bus.publish(subjects.SUBJECT_SUBMIT, spec, msg_id="huge")
    kv = await bus.kv(subjects.KV_NODES, NodeSpec)
    big = NodeSpec(
        id="n1",
        gpu_model="T4",
        gpu_count=1,
        gpu_mem_gb=16.0,
        host_mem_gb=64.0,
        cpus=8,
        idle_power_w=10.0,
        max_power_w=70.0,
        labels={"junk": "x" * bus.nc.max_payload},
    )
    with pytest.raises(PayloadTooLarge, match=r"\$KV.nodes.n1"):
        await kv.put("n1", big)
    assert await kv.get("n1") is None
    small = NodeSpec(**{**{f: getattr(big, f) for f in big.__struct_fields__}, "labels": {}})
    await kv.put("n1", small)
    assert (await kv.get("n1")).value == small  # type: ignore[union-attr]
    assert bus.nc.is_connected and bus.nc.stats["reconnects"] == 0


async def test_plain_nats_py_closes_for_good_on_a_server_error(nats_url: str) -> None:
    # why Bus uses its own client class: this is what nats-py does by itself
    nc = await nats.connect(nats_url, reconnect_time_wait=0.1, max_reconnect_attempts=-1)
    try:
        await nc.publish("x.y", b"x" * (nc.max_payload - 10), headers={"H": "h" * 100})
        await wait_for(lambda: nc.is_closed, what="nats-py closing the client")
        assert "maximum payload violation" in str(nc.last_error).lower()
    finally:
        await nc.close()


async def test_bus_reconnects_after_a_server_error_and_its_loops_go_on(bus: Bus) -> None:
    got: list[str] = []
    events: list[str] = []

    async def on_sample(s: TelemetrySample) -> None:
        got.append(s.node)

    async def on_event(ev: LifecycleEvent) -> None:
        events.append(ev.job_id)

    await bus.subscribe(subjects.TELEMETRY_ALL, TelemetrySample, on_sample)
    await bus.consume(subjects.STREAM_LIFECYCLE, "lifecycle.>", LifecycleEvent, on_event)
    headers = {"H": "h" * 100}
    room = bus.nc.max_payload - header_size(headers)
    # exactly at the server's limit (as header_size counts it): accepted and delivered
    edge = await bus.nc.subscribe("edge.x")
    await bus.nc.publish("edge.x", b"e" * room, headers=headers)
    assert len((await edge.next_msg(timeout=5)).data) == room
    assert bus.nc.stats["reconnects"] == 0
    # one byte more, sent raw past the bus's own check: the server errs and drops us
    await bus.nc.publish("edge.x", b"e" * (room + 1), headers=headers)
    await wait_for(
        lambda: bus.nc.stats["reconnects"] >= 1 and bus.nc.is_connected,
        timeout_s=10,
        what="reconnect after -ERR",
    )
    assert not bus.nc.is_closed
    await bus.publish("telemetry.n1", sample("n1"), durable=False)
    await bus.publish("lifecycle.j1", Started(job_id="j1", time=1.0))
    await wait_for(lambda: "n1" in got and "j1" in events, what="both loops after reconnect")
    assert bus.health.healthy(), bus.health.problems()
