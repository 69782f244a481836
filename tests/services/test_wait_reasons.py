"""A deep queue on a real nats-server (issue 13): 3,000 pending jobs, more than the old ranked
queue (one KV value, cut at about 2,000) could hold, are all held by the placer's scheduler, each
gets a REASON the API shows (a ``Queued`` from the placer when its reason changes), the reasons
do not flap while nothing changes, and ``mosaic explain``'s record of a pending job carries
numbers: its rank, its score terms and what the closest node lacks."""

from __future__ import annotations

import asyncio

import aiohttp
import msgspec

from libs.bus import Bus
from proto import subjects
from proto.events import LifecycleEvent, Queued
from proto.jobs import JobSpec
from proto.views import JobView
from tests.services._gateway_auth import ADMIN
from tests.services._placer_executor import FakeExecutor
from tests.services._scorer_util import poll, put_nodes, submit
from tests.services.test_cordon_stack import running_placer
from tests.services.test_gateway import gateway
from tests.services.test_placer import small_cluster

N_JOBS = 3000


async def _pending(http: aiohttp.ClientSession, base: str) -> list[JobView]:
    async with http.get(f"{base}/v1/jobs", params={"state": "pending"}) as r:
        assert r.status == 200
        return msgspec.json.decode(await r.read(), type=dict[str, list[JobView]])["jobs"]


async def test_every_pending_job_of_a_deep_queue_has_a_steady_reason(nats_url, bus: Bus):
    await put_nodes(bus, small_cluster())  # 8 GPUs: almost every job waits
    executor = FakeExecutor(bus, run_s=3600.0)  # nothing ends during the test
    await executor.start()
    queued: list[Queued] = []

    async def on_event(ev: LifecycleEvent) -> None:
        if isinstance(ev, Queued) and ev.reason:
            queued.append(ev)

    await bus.subscribe(f"{subjects.LIFECYCLE_PREFIX}.>", LifecycleEvent, on_event)
    async with (
        gateway(nats_url) as base,
        running_placer(nats_url) as placer,
        aiohttp.ClientSession(headers=ADMIN) as http,
    ):
        await poll(lambda: asyncio.sleep(0, placer.active))
        specs = [JobSpec(id=f"deep-{i:04d}", gpus=1, priority=1 + i % 9) for i in range(N_JOBS)]
        await asyncio.gather(*(submit(bus, s) for s in specs))
        sched = await poll(lambda: asyncio.sleep(0, placer.feed.sched), timeout_s=30)
        await poll(lambda: asyncio.sleep(0, len(placer.tracker.specs) == N_JOBS), timeout_s=60)

        async def settled() -> int:
            """The jobs placed once the scheduler holds every other one (0: not yet; a loaded
            machine may read the ledger between a cycle's commits and its queue's update)."""
            await asyncio.sleep(0)
            placed = len(placer.ledger)
            return placed if placed and len(sched.queue) == N_JOBS - placed else 0

        placed = await poll(settled, timeout_s=60)
        assert placed <= 8  # the scheduler holds all the others (settled)

        async def all_reasoned() -> list[JobView]:
            jobs = await _pending(http, base)
            ok = len(jobs) == N_JOBS - placed and all(j.reason for j in jobs)
            return jobs if ok else []

        jobs = await poll(all_reasoned, timeout_s=90)
        assert {j.reason for j in jobs} <= {"Priority", "Resources", "Reserved", "SlowGPU"}
        told = len(queued)
        await asyncio.sleep(6 * placer.settings.tick_s)  # cycles with nothing changing
        assert len(queued) == told, "reasons flapped while nothing changed"

        # an explained wait: the job's rank, score terms and what the closest node lacks
        async def numbers() -> dict | None:
            for j in jobs[:200]:
                async with http.get(f"{base}/v1/jobs/{j.spec.id}/decisions") as r:
                    body = msgspec.json.decode(await r.read())
                waits = [d["wait"] for d in body["decisions"] if d.get("wait")]
                if waits:
                    return waits[-1]
            return None

        w = await poll(numbers, timeout_s=30)
        assert 1 <= w["rank"] <= w["queued"] <= N_JOBS
        assert set(w["terms"]) >= {"base", "fair_share", "urgency", "aging"}
        assert w["best_node"] in {n.id for n in small_cluster()}
        assert w["lacks"]
    await executor.close()
