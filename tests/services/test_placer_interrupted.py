"""A placement cycle cut short by a NATS error loses no capacity and no power command.

Why: losing one of three NATS servers leaves a stream without a leader for seconds, and a
placer cycle whose publish to it failed used to stop half way. The placements of the pass after
the failed commit stayed on the scheduler's view, holding GPUs no job had (a job needing them
waited for ever), and the pass's power commands were never sent although the scheduler counted
on them. Here the stream that fails is NODECMD, made to refuse every publish for a while (a full
stream that discards new messages: a real server refusal, no mock) while a pass places two jobs
on one node, or decides to suspend idle nodes.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
import nats.js.errors
import pytest
from nats.js import api

from libs.bus import Bus
from libs.clock import Clock
from libs.obs.logging import get_logger
from libs.obs.tracing import setup_tracing
from libs.policy.config import PolicyConfig
from libs.policy.inventory import NodeGroup, expand
from proto import subjects
from proto.events import Completed
from proto.jobs import JobSpec
from proto.ledger import Allocation
from proto.power import PowerCommand
from services.placer.power import OwedPower
from services.placer.service import Placer, PlacerSettings
from tests.services._placer_executor import FakeExecutor
from tests.services._scorer_util import by_job, connect, lifecycle_events, poll, put_nodes, submit
from tests.services.test_placer import FAST

FILLER = "node.filler.power"  # in NODECMD, read by no consumer of these tests


@asynccontextmanager
async def refusing(bus: Bus, stream: str) -> AsyncIterator[None]:
    """``stream`` refuses every publish inside the block (full, discarding new messages): its
    publishes raise, as they do while it has no leader. Its configuration is restored after."""
    await bus.js.publish(FILLER, b"{}")  # a full stream needs at least one message
    info = await bus.js.stream_info(stream)
    config = info.config
    full = dataclasses.replace(config, max_msgs=info.state.messages, discard=api.DiscardPolicy.NEW)
    await bus.js.update_stream(full)
    try:
        yield
    finally:
        await bus.js.update_stream(config)


async def _placer(url: str, policy: PolicyConfig | None = None) -> tuple[Placer, Bus]:
    pbus = await Bus.connect(url, "placer")
    settings = PlacerSettings(holder="interrupted", **FAST)
    p = Placer(
        pbus,
        Clock.from_env(),
        get_logger(service="placer"),
        setup_tracing("placer"),
        settings,
        policy=policy,
    )
    await p.start()
    return p, pbus


async def _completed(bus: Bus, jobs: set[str]) -> bool:
    per = by_job(await lifecycle_events(bus))
    return all(any(isinstance(e, Completed) for e in per.get(j, [])) for j in jobs)


async def test_placements_after_a_failed_commit_give_their_gpus_back(nats_url: str) -> None:
    """Two 2-GPU jobs placed in one pass on one 4-GPU node; the first commit fails on its run
    command. Afterwards a 4-GPU job must still find the whole node free."""
    bus = await connect(nats_url)
    node = expand([NodeGroup(count=1, gpu_model="t4", gpu_count=4, host_mem_gb=64, cpus=32)])
    executor = FakeExecutor(bus, run_s=0.3)
    await executor.start()
    p, pbus = await _placer(nats_url, PolicyConfig.default())
    stop = asyncio.Event()
    task = asyncio.create_task(p.run(stop))
    try:
        await poll(lambda: asyncio.sleep(0, p.active), timeout_s=20)
        async with refusing(bus, subjects.STREAM_NODECMD):
            for j in ("a", "b"):
                await submit(bus, JobSpec(id=j, gpus=2))
            await poll(lambda: asyncio.sleep(0, {"a", "b"} <= set(p.tracker.specs)))
            await put_nodes(bus, node)  # the first pass with a node places both at once
            await poll(lambda: asyncio.sleep(0, bool(p.ledger)), timeout_s=20)
            await asyncio.sleep(1.0)  # a few more cycles fail on the refused stream
        await poll(lambda: _completed(bus, {"a", "b"}), timeout_s=30, every_s=0.2)
        await submit(bus, JobSpec(id="whole", gpus=4))
        await poll(lambda: _completed(bus, {"whole"}), timeout_s=30, every_s=0.2)
        assert executor.duplicates == 0
    finally:
        stop.set()
        await task
        await pbus.close()
        await bus.close()


async def test_a_ledger_entry_found_unannounced_is_announced(nats_url: str) -> None:
    """The ledger already holds the job (a create whose reply was lost with its server) but no
    Placed or run was ever sent: the placer takes the entry and sends them, so the job runs."""
    bus = await connect(nats_url)
    node = expand([NodeGroup(count=1, gpu_model="t4", gpu_count=4, host_mem_gb=64, cpus=32)])
    await put_nodes(bus, node)
    executor = FakeExecutor(bus, run_s=0.2)
    await executor.start()
    p, pbus = await _placer(nats_url)
    stop = asyncio.Event()
    task = asyncio.create_task(p.run(stop))
    try:
        await poll(lambda: asyncio.sleep(0, p.active), timeout_s=20)
        spec = JobSpec(id="orphan", gpus=1)
        alloc = Allocation(
            job_id=spec.id,
            node=node[0].id,
            gpu_indices=(3,),
            gpu_share=1.0,
            gpu_mem_gb=spec.gpu_mem_gb,
            host_mem_gb=spec.host_mem_gb,
            cpus=spec.cpus,
            time=0.0,
            spec=spec,
        )
        await (await bus.kv(subjects.KV_LEDGER, Allocation)).create(spec.id, alloc)
        await submit(bus, spec)
        await poll(lambda: _completed(bus, {spec.id}), timeout_s=20, every_s=0.2)
        assert [r.allocation.gpu_indices for r in executor.runs] == [(3,)]  # the ledger's word
    finally:
        stop.set()
        await task
        await pbus.close()
        await bus.close()


async def _power_commands(bus: Bus) -> list[PowerCommand]:
    info = await bus.js.stream_info(subjects.STREAM_NODECMD)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        m = await bus.js.get_msg(subjects.STREAM_NODECMD, seq)
        if m.subject.endswith(".power") and m.subject != FILLER:
            out.append(msgspec.json.decode(m.data, type=PowerCommand))
    return out


async def test_power_commands_of_a_failed_cycle_are_sent_once_the_stream_takes_them(
    nats_url: str,
) -> None:
    """Idle nodes are due to sleep at once; the pass that decides it cannot send the commands.
    They go out once NODECMD takes publishes again (the scheduler believes them asleep, so it
    would never decide it again)."""
    bus = await connect(nats_url)
    nodes = expand([NodeGroup(count=2, gpu_model="t4", gpu_count=4, host_mem_gb=64, cpus=32)])
    policy = dataclasses.replace(PolicyConfig.default(), suspend_after_s=0.0)
    p, pbus = await _placer(nats_url, policy)
    stop = asyncio.Event()
    task = asyncio.create_task(p.run(stop))
    try:
        await poll(lambda: asyncio.sleep(0, p.active), timeout_s=20)
        async with refusing(bus, subjects.STREAM_NODECMD):
            await put_nodes(bus, nodes)
            ids = {n.id for n in nodes}

            async def all_asleep() -> bool:  # in the scheduler's mind
                sched = p.feed.sched
                return sched is not None and all(sched.power_state(n) == "asleep" for n in ids)

            await poll(all_asleep, timeout_s=20)
            await asyncio.sleep(1.0)  # a few more cycles, all failing
            assert await _power_commands(bus) == []

        async def every_node_sent() -> list[PowerCommand] | None:  # not just the first one
            sent = await _power_commands(bus)
            return sent if len(sent) >= len(nodes) else None

        sent = await poll(every_node_sent, timeout_s=20)
        assert sorted((c.node, c.action) for c in sent) == [(n.id, "suspend") for n in nodes]
        assert len(p.power_owed) == 0
    finally:
        stop.set()
        await task
        await pbus.close()
        await bus.close()


async def test_owed_power_keeps_what_failed_and_sends_each_once(nats_url: str) -> None:
    bus = await connect(nats_url)
    owed = OwedPower()
    try:
        async with refusing(bus, subjects.STREAM_NODECMD):
            owed.owe(["n1"], ["n2"], 10.0, "test")
            with pytest.raises(nats.js.errors.APIError):
                await owed.send(bus)
            assert len(owed) == 2
        assert await owed.send(bus) == 2
        owed.owe(["n1"], [], 10.0, "test")  # the same decision again: a duplicate, dropped
        assert await owed.send(bus) == 0
        assert [(c.node, c.action) for c in await _power_commands(bus)] == [
            ("n1", "suspend"),
            ("n2", "wake"),
        ]
    finally:
        await bus.close()
