"""The placer's inference services (issue 16; ``services.placer.scaling``), on a real
nats-server with the real placer and a stand-in executor: a restarted placer rebuilds the
replicas from the lifecycle and submits none again; a removed service's replicas end through
the cancel path, a waiting one at once, a running one killed, both ``Cancelled`` "scaled down";
every order is an audit record."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from libs.bus import Bus
from libs.client.load import report_load
from proto import subjects
from proto.events import Cancelled, Submitted
from proto.inference import InferenceService, LoadReport
from proto.jobs import JobSpec
from proto.nodes import NodeSpec
from proto.service_views import SCALE_DOWN, SCALE_UP, SCALED_DOWN
from tests.services._placer_executor import FakeExecutor
from tests.services._scorer_util import lifecycle_events, poll, put_nodes
from tests.services.test_cordon_stack import running_placer

TWO_GPUS = NodeSpec(
    id="inf-0", gpu_model="v100-32gb", gpu_count=2, gpu_mem_gb=32, host_mem_gb=64, cpus=16,
    idle_power_w=40, max_power_w=300,
)  # fmt: skip
REPLICA = JobSpec(
    id="template", priority=8, gpus=1, gpu_mem_gb=8, host_mem_gb=8, cpus=2, kind="inference",
    workload_class="inference", latency_p99_ms=100.0, est_runtime_s=86_400.0,
)  # fmt: skip
SVC = InferenceService(id="svc", replica=REPLICA, rps_per_replica=100.0, max_replicas=3)


async def _submitted(bus: Bus) -> list[str]:
    return [e.job_id for e in await lifecycle_events(bus) if isinstance(e, Submitted)]


async def _decisions(bus: Bus) -> list[dict]:
    info = await bus.js.stream_info(subjects.STREAM_DECISIONS)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        d = msgspec.json.decode((await bus.js.get_msg(subjects.STREAM_DECISIONS, seq)).data)
        if d["action"] in (SCALE_UP, SCALE_DOWN):
            out.append(d)
    return out


async def test_a_restarted_placer_rebuilds_its_replicas_and_submits_none_twice(
    nats_url: str, bus: Bus
) -> None:
    await put_nodes(bus, [TWO_GPUS])
    kv = await bus.kv(subjects.KV_SERVICES, InferenceService)
    await kv.put("svc", msgspec.structs.replace(SVC, min_replicas=2))
    executor = FakeExecutor(bus, run_s=3600.0)  # replicas serve until stopped
    await executor.start()
    async with running_placer(nats_url) as placer:
        await poll(lambda: asyncio.sleep(0, len(placer.ledger) == 2), timeout_s=15)
    first = await _submitted(bus)
    assert len(first) == 2 and all(j.startswith("svc-") for j in first)
    async with running_placer(nats_url) as placer:
        await poll(lambda: asyncio.sleep(0, placer.active), timeout_s=15)
        await asyncio.sleep(1.0)  # a few cycles
        sched = placer.feed.sched
        assert sched is not None and set(sched.scaler.replicas["svc"]) == set(first)
        assert await _submitted(bus) == first  # nothing asked again
        # it still scales: 290 req/s on two replicas of 100 asks for a third (the maximum),
        # which waits (no GPU left); the service's removal then stops all three
        await bus.nc.publish(
            subjects.load("svc"),
            msgspec.json.encode(LoadReport(service="svc", time=placer.clock.now(), rps=290.0)),
        )
        await poll(lambda: asyncio.sleep(0, len(placer.tracker.specs) == 3), timeout_s=10)
        (third,) = set(placer.tracker.specs) - set(first)
        await kv.delete("svc")

        async def all_cancelled() -> bool:
            ends = [e for e in await lifecycle_events(bus) if isinstance(e, Cancelled)]
            return {e.job_id for e in ends} == {*first, third} and ends

        ends = await poll(all_cancelled, timeout_s=15)
    assert all(e.reason.startswith(f"{SCALED_DOWN}: service removed") for e in ends)
    assert [r.allocation.job_id for r in executor.runs] == first  # the third never ran
    audit = await _decisions(bus)
    assert sorted(d["job_id"] for d in audit if d["action"] == SCALE_UP) == sorted([*first, third])
    assert sorted(d["job_id"] for d in audit if d["action"] == SCALE_DOWN) == sorted(
        [*first, third]
    )
    assert all(d["reason"].startswith("svc: ") for d in audit)
    await executor.close()


async def test_report_load_refuses_an_unsound_report_naming_the_field_before_sending() -> None:
    class Never:
        async def publish(self, subject: str, data: bytes) -> None:
            raise AssertionError("an unsound report was sent")

    with pytest.raises(ValueError, match="rps"):
        await report_load(Never(), "svc", rps=-1.0, time_s=1.0)
    with pytest.raises(ValueError, match="service"):
        await report_load(Never(), "no such id", rps=1.0, time_s=1.0)
