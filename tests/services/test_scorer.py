"""The scorer on a real NATS server: submissions become a ranked queue in KV, placed jobs leave
it, ``Queued`` goes out once per job, and a restarted scorer rebuilds the same queue."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import msgspec
import pytest

from libs.policy.inventory import demo_cluster
from proto import subjects
from proto.decisions import RankedEntry, RankedQueue
from proto.events import Cancelled, Placed, Preempted, Queued
from proto.jobs import JobSpec
from services.scorer.pending import PendingSet
from services.scorer.service import fit_payload
from services.scorer.service import main as scorer_main
from tests.services._scorer_util import (
    by_job,
    connect,
    lifecycle_events,
    poll,
    put_nodes,
    start_in_process,
    submit,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


async def _queue(bus) -> RankedQueue | None:
    kv = await bus.kv(subjects.KV_QUEUE, RankedQueue)
    e = await kv.get(subjects.KV_QUEUE_KEY)
    return e.value if e else None


def _ids(q: RankedQueue | None) -> list[str]:
    return [e.spec.id for e in q.entries] if q else []


async def test_ranked_queue_orders_by_priority_and_drops_placed_jobs(nats_url):
    bus = await connect(nats_url)
    await put_nodes(bus, demo_cluster())
    svc = start_in_process("scorer", scorer_main, nats_url, rescore_s=0.5, debounce_s=0.05)
    try:
        now = time.time()
        prios = {"j-low": 1, "j-mid": 5, "j-high": 9, "j-mid2": 5}
        for job, p in prios.items():
            await submit(bus, JobSpec(id=job, priority=p), now=now)

        async def full():
            q = await _queue(bus)
            return q if set(_ids(q)) == set(prios) else None

        q = await poll(full)
        ids = _ids(q)
        assert ids[0] == "j-high" and ids[-1] == "j-low"
        scores = [e.score for e in q.entries]
        assert scores == sorted(scores, reverse=True)
        assert all(set(e.terms) >= {"base", "fair_share", "aging"} for e in q.entries)

        # placed and cancelled jobs leave the queue
        await bus.publish(
            subjects.lifecycle("j-high"),
            Placed(job_id="j-high", time=time.time(), node="a100-0", gpu_indices=(0,)),
        )
        await bus.publish(subjects.lifecycle("j-low"), Cancelled(job_id="j-low", time=time.time()))

        async def drained():
            q = await _queue(bus)
            return q if set(_ids(q)) == {"j-mid", "j-mid2"} else None

        q = await poll(drained)
        assert q.entries[0].score >= q.entries[1].score

        # a preempted job comes back (with its original enqueue time)
        await bus.publish(
            subjects.lifecycle("j-high"), Preempted(job_id="j-high", time=time.time())
        )

        async def back():
            q = await _queue(bus)
            return q if "j-high" in _ids(q) else None

        q = await poll(back)
        assert _ids(q)[0] == "j-high"
        entry = next(e for e in q.entries if e.spec.id == "j-high")
        assert entry.enqueued_at == pytest.approx(now)

        # one Queued per (job, attempt): j-high twice (attempt 1 and 2), the others once
        async def queued_counts():
            per = by_job(await lifecycle_events(bus))
            counts = {j: sum(isinstance(e, Queued) for e in evs) for j, evs in per.items()}
            return counts if counts.get("j-high") == 2 else None

        counts = await poll(queued_counts)
        assert counts == {"j-low": 1, "j-mid": 1, "j-high": 2, "j-mid2": 1}
    finally:
        assert await svc.close() == 0
        await bus.close()


async def test_restart_rebuilds_the_same_queue(nats_url):
    bus = await connect(nats_url)
    await put_nodes(bus, demo_cluster())
    now = time.time()
    for i in range(30):
        await submit(bus, JobSpec(id=f"r-{i:02d}", priority=i % 10, tenant=f"t{i % 3}"), now=now)
    for i in range(0, 30, 4):  # some were placed before the scorer ever ran
        await bus.publish(
            subjects.lifecycle(f"r-{i:02d}"),
            Placed(job_id=f"r-{i:02d}", time=now, node="a100-0", gpu_indices=(0,)),
        )
    expected = {f"r-{i:02d}" for i in range(30) if i % 4}

    svc = start_in_process("scorer", scorer_main, nats_url, rescore_s=0.5, debounce_s=0.05)

    async def ready():
        q = await _queue(bus)
        return q if set(_ids(q)) == expected else None

    try:
        first = await poll(ready)
    finally:
        assert await svc.close() == 0
    kv = await bus.kv(subjects.KV_QUEUE, RankedQueue)
    await kv.delete(subjects.KV_QUEUE_KEY)

    svc = start_in_process("scorer", scorer_main, nats_url, rescore_s=0.5, debounce_s=0.05)
    try:
        second = await poll(ready)
    finally:
        assert await svc.close() == 0
    assert _ids(second) == _ids(first)
    # the restart re-emitted no Queued event, and placed jobs never got one
    per = by_job(await lifecycle_events(bus))
    for job, evs in per.items():
        n = sum(isinstance(e, Queued) for e in evs)
        assert n == (1 if job in expected else 0), job
    await bus.close()


def test_pending_set_folds_events_in_any_replay():
    s = PendingSet()
    spec = JobSpec(id="a", submit_time=10.0)
    from proto.events import Checkpointed, Completed, Submitted

    assert s.apply(Submitted(job_id="a", time=10.0, spec=spec))
    assert not s.apply(Submitted(job_id="a", time=11.0, spec=spec))  # duplicate
    assert s.needs_queued_event("a")
    s.apply(Queued(job_id="a", time=10.5))
    assert not s.needs_queued_event("a")
    assert s.apply(Placed(job_id="a", time=12.0, attempt=1))
    s.apply(Checkpointed(job_id="a", time=13.0, progress=0.4))
    assert s.apply(Preempted(job_id="a", time=14.0))
    p = s.pending["a"]
    assert (p.attempt, p.progress, p.enqueued_at) == (2, 0.4, 10.0)
    assert s.needs_queued_event("a")
    assert s.apply(Completed(job_id="a", time=15.0))
    assert len(s) == 0 and s.is_terminal("a")
    assert not s.apply(Preempted(job_id="a", time=16.0))  # nothing revives an ended job


def test_scorer_process_ranks_and_stops_cleanly_on_sigterm(nats_url):
    async def go() -> None:
        bus = await connect(nats_url)
        await put_nodes(bus, demo_cluster())
        await submit(bus, JobSpec(id="p-1"))
        await bus.close()

    asyncio.run(go())
    env = {**os.environ, "MOSAIC_NATS_URL": nats_url, "MOSAIC_LOG_FORMAT": "json"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.scorer"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        async def check() -> None:
            bus = await connect(nats_url)
            try:
                q = await poll(lambda: _queue(bus), timeout_s=30)
                assert _ids(q) == ["p-1"]
            finally:
                await bus.close()

        asyncio.run(check())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, proc.stderr.read().decode()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_an_oversized_queue_keeps_its_head_and_fits_the_message_limit():
    entries = tuple(
        RankedEntry(spec=JobSpec(id=f"q-{i:04d}"), score=1000.0 - i) for i in range(500)
    )
    q = RankedQueue(time=1.0, load=0.2, regime="low", entries=entries)
    full = len(msgspec.json.encode(q))
    cut = fit_payload(q, full // 3)
    assert len(msgspec.json.encode(cut)) <= full // 3
    assert 100 < len(cut.entries) < 500
    assert cut.entries == entries[: len(cut.entries)]
    assert fit_payload(q, full) is q
