"""The scorer's pending set and the placer's tracker restart from snapshots, on a real NATS.

A restarted scorer or placer with a snapshot handles only the LIFECYCLE events after it and has
the same state; a job pending since before the old events were purged is still known after a
restart and gets placed (without snapshots its ``Submitted`` is gone and it would wait forever);
a corrupt snapshot means a full replay; a placer that crashes after a periodic snapshot and is
restarted (replaying the events its snapshot partly holds) places each job exactly once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from libs.bus import Bus
from libs.bus.snapshot import SnapshotSettings, SnapshotStore
from libs.clock import Clock
from libs.obs.logging import get_logger
from libs.obs.tracing import setup_tracing
from libs.policy.inventory import NodeGroup, demo_cluster, expand
from proto import subjects
from proto.events import Cancelled, Completed, Placed, Queued, Started, Submitted, is_terminal
from proto.jobs import CancelRequest, JobSpec
from proto.ledger import Allocation
from services.placer.service import Placer, PlacerSettings
from services.placer.snapshot import SNAPSHOT_KEY as PLACER_KEY
from services.scorer.service import SNAPSHOT_KEY as SCORER_KEY
from services.scorer.service import Scorer, ScorerSettings
from tests.services._placer_checks import LedgerChecker
from tests.services._placer_executor import FakeExecutor
from tests.services._scorer_util import by_job, lifecycle_events, poll, put_nodes, submit

# only a clean stop saves (exact counts), unless a test asks for periodic saves
QUIET = SnapshotSettings(every_events=1_000_000, every_s=3600.0)
FAST = {"tick_s": 0.5, "debounce_s": 0.02, "settle_s": 0.2, "lease_ttl_s": 2.0}


@asynccontextmanager
async def scorer(url: str, snapshots: SnapshotSettings = QUIET) -> AsyncIterator[Scorer]:
    """A scorer on its own connection, caught up and ranking; stopped cleanly (saving) after."""
    b = await Bus.connect(url, "scorer")
    settings = ScorerSettings(rescore_s=0.5, debounce_s=0.05, snapshots=snapshots)
    s = Scorer(b, Clock(epoch=time.time()), get_logger(service="scorer"), settings)
    stop = asyncio.Event()
    try:
        await s.start()
        task = asyncio.create_task(s.run(stop))
        yield s
        stop.set()
        await task
        await s.snapshots.stop()
    finally:
        await b.close()


@asynccontextmanager
async def placer(
    url: str, holder: str, snapshots: SnapshotSettings = QUIET, *, crash: bool = False
) -> AsyncIterator[Placer]:
    """A placer, active once it holds the lease. ``crash``: no final save, no lease handed
    back (the connection is closed under it), as after a kill -9."""
    b = await Bus.connect(url, "placer")
    settings = PlacerSettings(holder=holder, snapshots=snapshots, **FAST)
    p = Placer(
        b, Clock(epoch=time.time()), get_logger(service=holder), setup_tracing("p"), settings
    )
    stop = asyncio.Event()
    try:
        await p.start()
        task = asyncio.create_task(p.run(stop))
        await poll(lambda: asyncio.sleep(0, p.active), timeout_s=10)
        yield p
        if crash:
            assert p.snapshots.snapshotter is not None
            await p.snapshots.snapshotter.stop(final=False)
            await b.close()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return
        stop.set()
        await task
        await p.snapshots.stop()
    finally:
        await b.close()


async def _last_seq(bus: Bus) -> int:
    return (await bus.js.stream_info(subjects.STREAM_LIFECYCLE)).state.last_seq


async def _events(bus: Bus) -> list:
    """Every event the stream still holds (none after a purge of all of them)."""
    info = await bus.js.stream_info(subjects.STREAM_LIFECYCLE)
    return await lifecycle_events(bus) if info.state.messages else []


async def _queued_counts(bus: Bus) -> dict[str, int]:
    """The scorer's admission ``Queued`` events per job (the placer's carry a reason)."""
    per = by_job(await lifecycle_events(bus))
    return {j: sum(isinstance(e, Queued) and not e.reason for e in evs) for j, evs in per.items()}


async def test_a_restarted_scorer_handles_only_the_events_after_its_snapshot(nats_url, bus):
    await put_nodes(bus, demo_cluster())
    for i in range(3):
        await submit(bus, JobSpec(id=f"s-{i}", priority=i))
    await bus.publish(subjects.lifecycle("s-0"), Placed(job_id="s-0", time=1.0, node="a100-0"))
    async with scorer(nats_url) as a:
        want = {"s-0": 1, "s-1": 1, "s-2": 1}  # s-0 placed before it started: scored too
        await poll(lambda: _queued_counts_are(bus, want))
        last = await _last_seq(bus)  # 4 + 3 Queued
        await poll(lambda: asyncio.sleep(0, a.snapshots.handled == last))
        before = dict(a.pending.pending)
    snap = await SnapshotStore(bus, SCORER_KEY, subjects.STREAM_LIFECYCLE).load()
    assert snap is not None and snap.seq == last == 7
    for i in range(3, 5):
        await submit(bus, JobSpec(id=f"s-{i}", priority=i))
    async with scorer(nats_url) as b:
        assert b.snapshots.handled == 2  # the two new Submitted, not one event before them
        assert {j: b.pending.pending[j] for j in before} == before
        assert sorted(b.pending.pending) == ["s-1", "s-2", "s-3", "s-4"]
        await poll(lambda: asyncio.sleep(0, len(b.pending.pending) == 4))
        want = {"s-0": 1, "s-1": 1, "s-2": 1, "s-3": 1, "s-4": 1}
        await poll(lambda: _queued_counts_are(bus, want))
    # one Queued per attempt: the restart did not announce s-0, s-1 and s-2 again
    assert await _queued_counts(bus) == want


async def _queued_counts_are(bus: Bus, want: dict[str, int]) -> bool:
    counts = await _queued_counts(bus)
    return {j: counts.get(j, 0) for j in want} == want


async def test_a_corrupt_scorer_snapshot_means_a_full_replay(nats_url, bus):
    await put_nodes(bus, demo_cluster())
    for i in range(3):
        await submit(bus, JobSpec(id=f"c-{i}"))
    async with scorer(nats_url) as a:
        await poll(lambda: _queued_counts_are(bus, {"c-0": 1, "c-1": 1, "c-2": 1}))
        last = await _last_seq(bus)
        await poll(lambda: asyncio.sleep(0, a.snapshots.handled == last))
        before = dict(a.pending.pending)
    obs = await bus.js.object_store(subjects.OBJ_SNAPSHOTS)
    await obs.put(SCORER_KEY, b"\x93\x01garbage")
    async with scorer(nats_url) as b:
        assert b.snapshots.restored is not None and b.snapshots.restored.model is None
        assert b.snapshots.handled == last and b.pending.pending == before


def _one_gpu() -> list:
    return expand([NodeGroup(count=1, gpu_model="v100-32gb", gpu_count=1, host_mem_gb=64)])


async def test_a_job_pending_since_before_a_purge_is_placed_after_a_restart(nats_url, bus):
    """One GPU: ``runner`` holds it, ``waiter`` waits. Both services stop (saving), LIFECYCLE
    loses every event they saved, both start again: they still know both jobs, and once the
    runner is cancelled the waiter is placed, once, and completes."""
    nodes = _one_gpu()
    await put_nodes(bus, nodes)
    checker = LedgerChecker(nodes)
    await checker.start(bus)
    executor = FakeExecutor(bus, run_s=0.2, hold={"runner"})
    await executor.start()
    ledger = await bus.kv(subjects.KV_LEDGER, Allocation)
    try:
        async with scorer(nats_url), placer(nats_url, "first"):
            await submit(bus, JobSpec(id="runner", gpus=1, priority=9))
            await poll(lambda: ledger.get("runner"))
            await submit(bus, JobSpec(id="waiter", gpus=1))
            await poll(lambda: _queued_counts_are(bus, {"runner": 1, "waiter": 1}))
            await poll(lambda: _has(bus, "runner", Started))
        seqs = []
        for key in (SCORER_KEY, PLACER_KEY):
            snap = await SnapshotStore(bus, key, subjects.STREAM_LIFECYCLE).load()
            assert snap is not None
            seqs.append(snap.seq)
        await bus.js.purge_stream(subjects.STREAM_LIFECYCLE, seq=min(seqs) + 1)
        assert not any(isinstance(e, Submitted) for e in await _events(bus))
        async with scorer(nats_url) as s, placer(nats_url, "second") as p:
            assert "waiter" in s.pending.pending
            assert {"runner", "waiter"} <= set(p.tracker.specs)
            assert p.tracker.started_seen("runner", 1)
            # only what came after the snapshots: each event handled has a sequence above
            # its service's snapshot and at most the stream's end when read after (the placer
            # may announce the waiter's reason again since its start)
            handled = s.snapshots.handled + p.snapshots.handled
            assert handled <= 2 * (await _last_seq(bus) - min(seqs))
            await bus.publish(subjects.SUBJECT_CANCEL, CancelRequest(job_id="runner"))
            await poll(lambda: _has(bus, "waiter", Completed), timeout_s=30)
            assert p.placed_count == 1
    finally:
        await executor.close()
    per = by_job(await lifecycle_events(bus))
    assert [type(e) for e in per["waiter"] if isinstance(e, (Placed, Completed))] == [
        Placed,
        Completed,
    ]
    assert sum(isinstance(e, Cancelled) for e in per["runner"]) == 1
    assert [r.allocation.job_id for r in executor.runs] == ["runner", "waiter"]
    assert executor.duplicates == 0 and checker.problems == []


async def _has(bus: Bus, job: str, kind: type) -> bool:
    return any(isinstance(e, kind) for e in by_job(await _events(bus)).get(job, []))


async def test_a_placer_crashing_after_a_periodic_snapshot_places_nothing_twice(nats_url, bus):
    nodes = expand(
        [
            NodeGroup(count=1, gpu_model="v100-32gb", gpu_count=4, host_mem_gb=128, cpus=32),
            NodeGroup(count=1, gpu_model="t4", gpu_count=4, host_mem_gb=64, cpus=32),
        ]
    )
    await put_nodes(bus, nodes)
    checker = LedgerChecker(nodes)
    await checker.start(bus)
    executor = FakeExecutor(bus, run_s=0.3)
    await executor.start()
    often = SnapshotSettings(every_events=5, every_s=0.2)
    jobs = [JobSpec(id=f"k-{i:02d}", gpus=1 + i % 2, gpu_mem_gb=8) for i in range(24)]
    ids = {j.id for j in jobs}
    try:
        async with scorer(nats_url, often):
            async with placer(nats_url, "first", often, crash=True) as a:
                for spec in jobs:
                    await submit(bus, spec)

                async def some_done() -> bool:
                    per = by_job(await lifecycle_events(bus))
                    return sum(any(isinstance(e, Completed) for e in v) for v in per.values()) >= 6

                await poll(some_done, timeout_s=60, every_s=0.2)
                assert a.snapshots.snapshotter is not None
                await poll(lambda: asyncio.sleep(0, a.snapshots.snapshotter.saves >= 2))
            at_crash = await _last_seq(bus)
            async with placer(nats_url, "second", often) as b:
                restored = b.snapshots.restored
                assert restored is not None and restored.model is not None
                assert b.snapshots.handled < at_crash  # not the whole stream again
                per = await poll(lambda: _all_ended(bus, ids), timeout_s=90, every_s=0.5)
                await poll(lambda: _ledger_empty(bus))
    finally:
        await executor.close()
    for job in ids:
        evs = per[job]
        assert sum(isinstance(e, Placed) for e in evs) == 1, job
        assert sum(is_terminal(e) for e in evs) == 1 and isinstance(evs[-1], Completed), job
    assert sorted(r.allocation.job_id for r in executor.runs) == sorted(ids)
    assert executor.duplicates == 0 and checker.problems == []


async def _all_ended(bus: Bus, ids: set[str]) -> dict:
    per = by_job(await lifecycle_events(bus))
    done = {j for j in ids if any(is_terminal(e) for e in per.get(j, []))}
    return per if done == ids else {}


async def _ledger_empty(bus: Bus) -> bool:
    kv = await bus.kv(subjects.KV_LEDGER, Allocation)
    return await kv.items() == {}


async def test_a_corrupt_placer_snapshot_means_a_full_replay(nats_url, bus):
    await submit(bus, JobSpec(id="p-0"))
    await submit(bus, JobSpec(id="p-1"))
    for ev in (
        Placed(job_id="p-0", time=2.0, node="n"),
        Started(job_id="p-0", time=3.0, node="n"),
        Completed(job_id="p-0", time=4.0, node="n"),
    ):
        await bus.publish(subjects.lifecycle("p-0"), ev)
    async with placer(nats_url, "first") as a:
        assert a.snapshots.handled == 5
        state = (dict(a.tracker.terminal), set(a.tracker.specs), dict(a.tracker.placed))
    async with placer(nats_url, "second") as b:
        assert b.snapshots.handled == 0  # the clean stop saved everything
    obs = await bus.js.object_store(subjects.OBJ_SNAPSHOTS)
    await obs.put(PLACER_KEY, b"not msgpack at all")
    async with placer(nats_url, "third") as c:
        assert c.snapshots.handled == 5
        assert (dict(c.tracker.terminal), set(c.tracker.specs), dict(c.tracker.placed)) == state
    assert state == ({"p-0": "completed"}, {"p-1"}, {})


async def test_takeover_after_a_snapshot_still_finishes_a_half_done_placement(nats_url, bus):
    """The tracker comes from a snapshot that holds the job's ``Submitted``; the ledger holds an
    allocation a crashed predecessor never announced. The new placer sends its ``Placed`` and
    run command once, and the job completes."""
    nodes = _one_gpu()
    spec = JobSpec(id="orphan", gpus=1, submit_time=time.time())
    await submit(bus, spec)
    async with placer(nats_url, "first") as a:  # no node yet: nothing is placed
        assert a.snapshots.handled == 1 and "orphan" in a.tracker.specs
    await put_nodes(bus, nodes)
    alloc = Allocation(
        job_id="orphan",
        node=nodes[0].id,
        gpu_indices=(0,),
        gpu_share=1.0,
        gpu_mem_gb=spec.gpu_mem_gb,
        host_mem_gb=spec.host_mem_gb,
        cpus=spec.cpus,
        time=time.time(),
        spec=spec,
    )
    await (await bus.kv(subjects.KV_LEDGER, Allocation)).create("orphan", alloc)
    executor = FakeExecutor(bus, run_s=0.2)
    await executor.start()
    try:
        async with placer(nats_url, "second") as b:
            assert b.snapshots.restored is not None and b.snapshots.restored.model is not None
            await poll(lambda: _has(bus, "orphan", Completed), timeout_s=30)
            await poll(lambda: _ledger_empty(bus))
            assert b.snapshots.handled == 3  # Placed (its own), Started, Completed
    finally:
        await executor.close()
    kinds = [type(e).__name__ for e in await _events(bus)]
    assert kinds == ["Submitted", "Placed", "Started", "Completed"]
    assert len(executor.runs) == 1 and executor.duplicates == 0
