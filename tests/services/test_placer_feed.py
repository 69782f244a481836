"""The placer's scheduler feed: the live placer's decisions without NATS (services.placer.feed).

What reaches the feed are the placer's folded facts (a ``JobTracker`` fed lifecycle events, the
ledger, the nodes); these tests drive it the way the service does, cycle after cycle.
"""

from __future__ import annotations

import math

from libs.policy.config import PolicyConfig
from libs.policy.inventory import demo_cluster
from libs.policy.profiles import ProfileTable
from proto.events import Cancelled, Completed, Submitted
from proto.jobs import JobSpec
from proto.ledger import Allocation
from services.placer.feed import SchedulerFeed
from services.placer.tracker import JobTracker
from tests.services._placer_checks import violations

NOW = 1.7e9
CFG = PolicyConfig.default()


def _feed() -> tuple[SchedulerFeed, JobTracker]:
    return SchedulerFeed(CFG, ProfileTable.default()), JobTracker()


def _submit(tracker: JobTracker, *specs: JobSpec, t: float = NOW) -> None:
    for s in specs:
        tracker.apply(Submitted(job_id=s.id, time=t, spec=s))


def _cycle(feed, tracker, nodes, ledger, *, now=NOW, settled=True, holds=None):
    """One cycle as the service runs it: sync, tick, commit every placement to ``ledger``."""
    sched, never = feed.sync(
        nodes={n.id: n for n in nodes},
        tracker=tracker,
        ledger=ledger,
        gone=set(),
        holds=holds or {"down": set()},
        temps={},
        now=now,
        settled=settled,
    )
    d = sched.tick(now)
    for p in d.places:
        ledger[p.allocation.job_id] = p.allocation
        tracker.note_placed(p.allocation.job_id, p.allocation.attempt)
        sched.start_job(p.allocation.job_id, p.allocation, p.job.spec, now)
    return sched, never, d


def test_a_cycle_places_by_policy_refuses_what_never_fits_and_says_why_the_rest_waits():
    nodes = demo_cluster()
    specs = [JobSpec(id=f"p-{i}", gpus=2, gpu_mem_gb=40, host_mem_gb=32) for i in range(20)]
    # 40 GPUs: more than any node, and than all nodes of one model together (a gang spans
    # nodes of one model: 4 x 8 A100 at most)
    specs += [JobSpec(id="never", gpus=40), JobSpec(id="half", gpus=0.5, gpu_mem_gb=8)]
    feed, tracker = _feed()
    _submit(tracker, *specs)
    ledger: dict[str, Allocation] = {}
    sched, never, _ = _cycle(feed, tracker, nodes, ledger)
    assert [s.id for s in never] == ["never"]
    # 4 A100 nodes x 8 GPUs hold 16 two-GPU 40 GB jobs; the rest wait; nothing on a T4/V100
    big = [a for a in ledger.values() if a.gpu_mem_gb == 40]
    assert len(big) == 16 and all(a.node.startswith("a100") for a in big)
    assert "half" in ledger and violations(ledger, {n.id: n for n in nodes}) == []
    waiting = set(sched.reasons())
    assert waiting == {s.id for s in specs[:20]} - set(ledger) | {"never"}
    # the next cycle (nothing changed) places nothing more and keeps every reason
    before = sched.reasons()
    _, never2, d2 = _cycle(feed, tracker, nodes, ledger, now=NOW + 1)
    assert d2.places == [] and never2 == [] and sched.reasons() == before


def test_an_unsound_submission_never_reaches_the_scheduler():
    feed, tracker = _feed()
    bad = [JobSpec(id="neg", gpus=-1.0), JobSpec(id="nan", est_runtime_s=math.nan)]
    _submit(tracker, *bad, JobSpec(id="ok", gpus=1.0))
    ledger: dict[str, Allocation] = {}
    sched, _, _ = _cycle(feed, tracker, demo_cluster(), ledger)
    assert set(ledger) == {"ok"} and len(sched.queue) == 0
    assert {s.id for s, _ in tracker.invalid_jobs()} == {"neg", "nan"}


def test_a_forged_ledger_entry_holds_nothing_and_the_cycle_still_places():
    nodes = demo_cluster()
    feed, tracker = _feed()
    _submit(tracker, JobSpec(id="forged"), JobSpec(id="ok"))
    forged = Allocation(
        job_id="forged",
        node=nodes[0].id,
        gpu_indices=(99,),
        gpu_share=1.0,
        gpu_mem_gb=8.0,
        host_mem_gb=8.0,
        cpus=2.0,
        time=NOW,
    )
    ledger = {"forged": forged}
    sched, _, _ = _cycle(feed, tracker, nodes, ledger)
    assert "ok" in ledger and sched.holds("forged") is None


def test_ends_and_cancels_reach_the_scheduler_incrementally():
    nodes = demo_cluster()
    feed, tracker = _feed()
    n_gpus = sum(n.gpu_count for n in nodes)
    short = {"gpus": 1, "est_runtime_s": 60.0, "cpus": 1, "host_mem_gb": 1}
    specs = [JobSpec(id=f"j-{i}", **short) for i in range(n_gpus + 2)]
    _submit(tracker, *specs)
    ledger: dict[str, Allocation] = {}
    sched, _, _ = _cycle(feed, tracker, nodes, ledger)
    assert len(ledger) == n_gpus and len(sched.queue) == 2
    waiting = sorted(j.spec.id for j in sched.queue)
    tracker.apply(Cancelled(job_id=waiting[0], time=NOW + 1))
    done = sorted(ledger)[0]
    tracker.apply(Completed(job_id=done, time=NOW + 1, node=ledger[done].node))
    del ledger[done]
    sched, _, d = _cycle(feed, tracker, nodes, ledger, now=NOW + 2)
    assert [p.job.spec.id for p in d.places] == [waiting[1]]
    assert len(sched.queue) == 0 and feed.rebuilds == 1  # no rebuild: the same scheduler


def test_a_changed_node_set_rebuilds_and_keeps_the_queue_order():
    nodes = demo_cluster()
    feed, tracker = _feed()
    n_gpus = sum(n.gpu_count for n in nodes)
    short = {"gpus": 1, "est_runtime_s": 60.0, "cpus": 1, "host_mem_gb": 1}
    _submit(tracker, *[JobSpec(id=f"j-{i:03d}", **short) for i in range(n_gpus + 5)])
    ledger: dict[str, Allocation] = {}
    sched, _, _ = _cycle(feed, tracker, nodes, ledger)
    order = [sched.queue[r].spec.id for r in sorted(range(5), key=lambda r: sched.queue.seq()[r])]
    assert len(sched.queue) == 5
    sched2, _ = feed.sync(
        nodes={n.id: n for n in nodes[:-1]},
        tracker=tracker,
        ledger=ledger,
        gone=set(),
        holds={},
        temps={},
        now=NOW + 1,
        settled=True,
    )
    assert sched2 is not sched and feed.rebuilds == 2
    seq = sched2.queue.seq()
    kept = [sched2.queue[r].spec.id for r in sorted(range(len(sched2.queue)), key=lambda r: seq[r])]
    assert kept == order


def test_held_nodes_take_nothing_until_released():
    nodes = demo_cluster()
    feed, tracker = _feed()
    _submit(tracker, JobSpec(id="a", gpus=1))
    everyone = {n.id for n in nodes}
    ledger: dict[str, Allocation] = {}
    sched, _, d = _cycle(feed, tracker, nodes, ledger, holds={"down": everyone})
    assert d.places == [] and sched.reason_of("a") != "Priority"
    _, _, d = _cycle(feed, tracker, nodes, ledger, now=NOW + 1, holds={"down": set()})
    assert [p.job.spec.id for p in d.places] == ["a"]
