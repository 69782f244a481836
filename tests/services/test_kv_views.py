"""The scorer's and the placer's views of KV buckets have no snapshot/watch gap: keys deleted
(and written) while a service starts are reflected once it runs, on a real NATS server."""

from __future__ import annotations

import asyncio
import time

from libs.bus import Bus
from libs.clock import Clock
from libs.obs.logging import get_logger
from libs.obs.tracing import setup_tracing
from libs.policy.inventory import NodeGroup, expand
from proto import subjects
from proto.ledger import Allocation
from proto.nodes import NodeSpec
from services.placer.service import Placer, PlacerSettings
from services.scorer.service import Scorer
from tests.services._scorer_util import connect, poll, put_nodes


def _alloc(i: int) -> Allocation:
    return Allocation(
        job_id=f"j-{i}",
        node="v100-0",
        gpu_indices=(0,),
        gpu_share=0.01,
        gpu_mem_gb=0.1,
        host_mem_gb=0.1,
        cpus=0.01,
        time=time.time(),
    )


async def _churn(bus: Bus, n: int) -> None:
    """Delete every allocation and write n new ones, as a busy placer would."""
    kv = await bus.kv(subjects.KV_LEDGER, Allocation)
    for i in range(n):
        await kv.delete(f"j-{i}")
        await kv.put(f"k-{i}", _alloc(i))
        await asyncio.sleep(0)


async def test_scorer_ledger_view_converges_with_deletes_during_start(nats_url):
    bus = await connect(nats_url)
    nodes = expand([NodeGroup(count=1, gpu_model="v100-32gb", gpu_count=4, host_mem_gb=64)])
    await put_nodes(bus, nodes)
    kv = await bus.kv(subjects.KV_LEDGER, Allocation)
    n = 150
    for i in range(n):
        await kv.put(f"j-{i}", _alloc(i))
    sbus = await Bus.connect(nats_url, "scorer")
    scorer = Scorer(sbus, Clock.from_env(), get_logger(service="scorer"))
    try:
        churn = asyncio.create_task(_churn(bus, n))
        await scorer.start()
        await churn
        want = {f"k-{i}" for i in range(n)}
        await poll(lambda: asyncio.sleep(0, set(scorer.ledger) == want), timeout_s=15)
        assert set(scorer.nodes) == {nodes[0].id}
    finally:
        await sbus.close()
        await bus.close()


async def test_placer_node_view_converges_with_nodes_leaving_during_start(nats_url):
    bus = await connect(nats_url)
    nodes = expand([NodeGroup(count=60, gpu_model="t4", gpu_count=1, host_mem_gb=16)])
    await put_nodes(bus, nodes)
    kv = await bus.kv(subjects.KV_NODES, NodeSpec)

    async def leave() -> None:
        for n in nodes[::2]:
            await kv.delete(n.id)
            await asyncio.sleep(0)

    pbus = await Bus.connect(nats_url, "placer")
    placer = Placer(
        pbus,
        Clock.from_env(),
        get_logger(service="placer"),
        setup_tracing("placer"),
        PlacerSettings(holder="views"),
    )
    try:
        task = asyncio.create_task(leave())
        await placer.start()
        await task
        want = {n.id for n in nodes[1::2]}
        await poll(lambda: asyncio.sleep(0, set(placer.nodes) == want), timeout_s=15)
    finally:
        await pbus.close()
        await bus.close()
