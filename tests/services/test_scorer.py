"""The scorer on a real NATS server: one admission ``Queued`` per attempt with a finite score,
higher priorities scored higher, no ranked queue anywhere, a restart that announces nothing
twice, a clean stop on SIGTERM; and the pending set's fold without a server."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
import time

import msgspec
import pytest
from nats.js.errors import NotFoundError

from libs.policy.config import PolicyConfig
from libs.policy.inventory import demo_cluster
from libs.policy.profiles import ProfileTable
from libs.policy.types import PendingJob
from proto import subjects
from proto.events import (
    Cancelled,
    Checkpointed,
    Completed,
    LifecycleEvent,
    Placed,
    Preempted,
    Queued,
    Submitted,
)
from proto.jobs import JobSpec
from proto.ledger import Allocation
from services.scorer.admission import admission_scores
from services.scorer.pending import PendingSet
from services.scorer.service import SNAPSHOT_KEY
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


async def _admissions(bus) -> dict[str, list[Queued]]:
    """The scorer's ``Queued`` events (those without a reason) per job, in stream order."""
    per = by_job(await lifecycle_events(bus))
    return {j: [e for e in evs if isinstance(e, Queued) and not e.reason] for j, evs in per.items()}


async def _published_queued(bus) -> tuple[list[str], object]:
    """Every ``Queued`` published from now on, repeats included: the stream drops a repeat of
    a message id, so only a plain subscription sees whether the scorer announced again."""
    published: list[str] = []
    decoder = msgspec.json.Decoder(LifecycleEvent)

    async def seen(msg) -> None:
        ev = decoder.decode(msg.data)
        if isinstance(ev, Queued):
            published.append(ev.job_id)

    sub = await bus.nc.subscribe(f"{subjects.LIFECYCLE_PREFIX}.>", cb=seen)
    return published, sub


def _counts_are(want: dict[str, int]):
    async def check(bus) -> dict[str, list[Queued]] | None:
        got = await _admissions(bus)
        return got if {j: len(got.get(j, [])) for j in want} == want else None

    return check


async def test_each_attempt_gets_one_finite_admission_score_higher_for_higher_priority(nats_url):
    bus = await connect(nats_url)
    await put_nodes(bus, demo_cluster())
    published, sub = await _published_queued(bus)
    svc = start_in_process("scorer", scorer_main, nats_url, rescore_s=0.3, debounce_s=0.05)
    try:
        now = time.time()
        prios = {"j-low": 1, "j-mid": 5, "j-high": 9}
        for job, p in prios.items():
            await submit(bus, JobSpec(id=job, priority=p), now=now)
        check = _counts_are(dict.fromkeys(prios, 1))
        got = await poll(lambda: check(bus))
        scores = {j: got[j][0].score for j in prios}
        assert all(s is not None and math.isfinite(s) for s in scores.values()), scores
        assert scores["j-high"] > scores["j-mid"] > scores["j-low"], scores
        assert all(e.rank is None and e.attempt == 1 for j in prios for e in got[j])

        # placed and cancelled jobs get nothing more; a preempted one is a new attempt
        await bus.publish(
            subjects.lifecycle("j-high"),
            Placed(job_id="j-high", time=time.time(), node="a100-0", gpu_indices=(0,)),
        )
        await bus.publish(subjects.lifecycle("j-low"), Cancelled(job_id="j-low", time=now))
        await bus.publish(
            subjects.lifecycle("j-high"), Preempted(job_id="j-high", time=time.time(), attempt=1)
        )
        check = _counts_are({"j-high": 2, "j-mid": 1, "j-low": 1})
        got = await poll(lambda: check(bus))
        assert [e.attempt for e in got["j-high"]] == [1, 2]
        await asyncio.sleep(1.0)  # several rounds: still one per attempt
        assert await check(bus)
        assert sorted(published) == ["j-high", "j-high", "j-low", "j-mid"]
        # the queue's order lives in the placer: the scorer keeps no ranked queue in KV
        with pytest.raises(NotFoundError):
            await bus.js.stream_info("KV_queue")
    finally:
        assert await svc.close() == 0
        await sub.unsubscribe()
        await bus.close()


async def test_a_restart_announces_nothing_twice(nats_url):
    bus = await connect(nats_url)
    await put_nodes(bus, demo_cluster())
    now = time.time()
    for i in range(30):
        await submit(bus, JobSpec(id=f"r-{i:02d}", priority=i % 10, tenant=f"t{i % 3}"), now=now)
    for i in range(0, 30, 4):  # placed before the scorer ever ran: still scored, once
        await bus.publish(
            subjects.lifecycle(f"r-{i:02d}"),
            Placed(job_id=f"r-{i:02d}", time=now, node="a100-0", gpu_indices=(0,)),
        )
    await bus.publish(subjects.lifecycle("r-01"), Cancelled(job_id="r-01", time=now))  # ended
    expected = {f"r-{i:02d}" for i in range(30)} - {"r-01"}
    check = _counts_are(dict.fromkeys(expected, 1))

    svc = start_in_process("scorer", scorer_main, nats_url, rescore_s=0.3, debounce_s=0.05)
    try:
        first = await poll(lambda: check(bus))
    finally:
        assert await svc.close() == 0
    # from its snapshot, then (the snapshot gone) from a replay of the whole stream: neither
    # announces again what the stream shows announced
    for restart, newcomer in (("snapshot", "r-new"), ("replay", "r-new2")):
        if restart == "replay":
            obs = await bus.js.object_store(subjects.OBJ_SNAPSHOTS)
            await obs.delete(SNAPSHOT_KEY)
        await submit(bus, JobSpec(id=newcomer), now=time.time())  # while it was down
        published, sub = await _published_queued(bus)
        svc = start_in_process("scorer", scorer_main, nats_url, rescore_s=0.3, debounce_s=0.05)
        try:
            await poll(lambda j=newcomer: _counts_are({j: 1})(bus))
            await asyncio.sleep(1.0)  # a few rounds after the restart
        finally:
            assert await svc.close() == 0
            await sub.unsubscribe()
        assert published == [newcomer], restart
    after = await _admissions(bus)
    for job in {f"r-{i:02d}" for i in range(30)}:
        assert len(after.get(job, [])) == (1 if job in expected else 0), job
        assert after.get(job, []) == first.get(job, []), job  # the same event, not a new one
    await bus.close()


def test_admission_scores_follow_priority_and_count_waiting_tenants() -> None:
    """Pure: newcomers only, scored against the cluster; the tenants already waiting dilute
    the fair share, as they do in the placer's queue."""
    nodes = demo_cluster()
    jobs = [PendingJob(JobSpec(id=f"a-{p}", priority=p), 0.0) for p in (0, 4, 9)]
    kw = {"now": 0.0, "cfg": PolicyConfig.default(), "profiles": ProfileTable.default()}
    got = admission_scores(jobs, nodes, [], **kw)
    assert [a.job.spec.id for a in got.scores] == ["a-0", "a-4", "a-9"]  # input order
    assert got.scores[0].score < got.scores[1].score < got.scores[2].score
    assert got.load == 0.0 and got.regime == "low"
    assert set(got.scores[0].terms) >= {"base", "fair_share", "aging"}
    held = [
        Allocation(
            job_id="r",
            node=nodes[0].id,
            gpu_indices=(0, 1),
            gpu_share=1.0,
            gpu_mem_gb=8.0,
            host_mem_gb=8.0,
            cpus=2.0,
            time=0.0,
            spec=JobSpec(id="r"),
        )
    ]
    alone = admission_scores(jobs, nodes, held, **kw).scores[0].terms["fair_share"]
    crowded = admission_scores(jobs, nodes, held, waiting_tenants={"x", "y", "z"}, **kw)
    assert 0 < crowded.scores[0].terms["fair_share"] < alone < 1  # one tenant of 4, not of 1
    assert admission_scores([], nodes, [], **kw).scores == []


def test_pending_set_folds_events_in_any_replay():
    s = PendingSet()
    spec = JobSpec(id="a", submit_time=10.0)
    assert s.apply(Submitted(job_id="a", time=10.0, spec=spec))
    assert not s.apply(Submitted(job_id="a", time=11.0, spec=spec))  # duplicate
    assert s.needs_queued_event("a")
    s.apply(Queued(job_id="a", time=10.2, reason="Resources"))  # the placer's: no admission
    assert s.needs_queued_event("a")
    s.apply(Queued(job_id="a", time=10.5))
    assert not s.needs_queued_event("a")
    assert s.apply(Placed(job_id="a", time=12.0, attempt=1))
    s.apply(Checkpointed(job_id="a", time=13.0, progress=0.4))
    assert s.apply(Preempted(job_id="a", time=14.0))
    p = s.pending["a"]
    assert (p.attempt, p.progress, p.enqueued_at) == (2, 0.4, 10.0)
    assert s.needs_queued_event("a")
    s.apply(Queued(job_id="a", time=14.1, attempt=1))  # attempt 1's, published late
    assert s.needs_queued_event("a")
    s.mark_queued("a", attempt=1)  # an announcement of attempt 1 finishing late
    assert s.needs_queued_event("a")
    s.apply(Queued(job_id="a", time=14.2, attempt=2))
    assert not s.needs_queued_event("a")
    assert s.apply(Completed(job_id="a", time=15.0))
    assert len(s) == 0 and s.is_terminal("a")
    assert not s.apply(Preempted(job_id="a", time=16.0))  # nothing revives an ended job
    assert s.unannounced() == []


def test_an_attempt_placed_before_its_score_is_still_scored_once():
    """The placer does not wait for the scorer: an attempt placed first is announced after,
    once, also by a set restored from a snapshot taken in between."""
    s = PendingSet()
    spec = JobSpec(id="b", submit_time=1.0)
    s.apply(Submitted(job_id="b", time=1.0, spec=spec))
    s.apply(Placed(job_id="b", time=1.1, attempt=1))
    assert len(s) == 0 and s.needs_queued_event("b")
    restored = PendingSet().load(s.encode())
    for model in (s, restored):
        [due] = model.unannounced()
        assert (due.spec, due.attempt, due.enqueued_at) == (spec, 1, 1.0)
        model.apply(Queued(job_id="b", time=1.2, score=0.5, attempt=1))
        assert model.unannounced() == [] and not model.needs_queued_event("b")
        model.apply(Queued(job_id="b", time=1.2, score=0.5, attempt=1))  # a replay
        assert not model.apply(Placed(job_id="b", time=1.1, attempt=1))  # a replay
        assert model.unannounced() == []


def test_scorer_process_announces_and_stops_cleanly_on_sigterm(nats_url):
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
                got = await poll(lambda: _counts_are({"p-1": 1})(bus), timeout_s=30)
                assert got["p-1"][0].score is not None
            finally:
                await bus.close()

        asyncio.run(check())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, proc.stderr.read().decode()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
