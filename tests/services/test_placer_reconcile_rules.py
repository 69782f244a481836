"""The reconciliation rules as a pure fold (``services.placer.reconcile``): which allocations are
lost and which nodes are down, given lifecycle events and executor reports with receipt times."""

from __future__ import annotations

from proto.events import Completed, Preempted, Started
from proto.ledger import Allocation
from proto.nodes import ExecutorReport, RunningAttempt
from services.placer.reconcile import Reconciler, ReconcileSettings


def alloc(job: str, node: str, attempt: int = 1) -> Allocation:
    return Allocation(
        job_id=job,
        node=node,
        gpu_indices=(0,),
        gpu_share=1.0,
        gpu_mem_gb=8,
        host_mem_gb=8,
        cpus=1,
        time=0.0,
        attempt=attempt,
    )


def report(node: str, *running: tuple[str, int], boot: str = "b1") -> ExecutorReport:
    return ExecutorReport(
        node=node,
        time=0.0,
        boot_id=boot,
        interval_s=1.0,
        running=tuple(RunningAttempt(job_id=j, attempt=a) for j, a in running),
    )


def started(job: str, node: str, attempt: int = 1) -> Started:
    return Started(job_id=job, time=0.0, node=node, attempt=attempt)


def test_a_started_attempt_its_node_stops_listing_is_lost_after_the_grace():
    r = Reconciler(ReconcileSettings(misses=3, grace_intervals=2), now=0.0)
    ledger = {"j": alloc("j", "n1")}
    r.on_report(report("n1"), 0.5)  # before Started: does not count
    r.on_event(started("j", "n1"), 1.0)
    r.on_report(report("n1", ("j", 1)), 2.0)
    assert r.lost(ledger, 2.0) == []
    for t in (3.0, 4.0):
        r.on_report(report("n1"), t)
    assert r.lost(ledger, 4.5) == []  # two misses only
    r.on_report(report("n1"), 5.0)  # third miss, the first one 2 intervals ago
    (lost,) = r.lost(ledger, 5.0)
    assert (lost.job_id, lost.attempt, lost.kind) == ("j", 1, "not_running")
    assert lost.reason == "lost: not running on n1"


def test_many_quick_reports_do_not_shorten_the_grace():
    r = Reconciler(ReconcileSettings(misses=3, grace_intervals=2), now=0.0)
    ledger = {"j": alloc("j", "n1")}
    r.on_event(started("j", "n1"), 1.0)
    for t in (1.1, 1.2, 1.3, 1.4, 1.5):  # reports on every job start/end elsewhere
        r.on_report(report("n1"), t)
    assert r.lost(ledger, 1.5) == []
    assert len(r.lost(ledger, 3.2)) == 1


def test_listing_again_resets_and_an_ended_attempt_is_never_lost():
    r = Reconciler(ReconcileSettings(misses=2, grace_intervals=0), now=0.0)
    ledger = {"a": alloc("a", "n1"), "b": alloc("b", "n1")}
    r.on_event(started("a", "n1"), 1.0)
    r.on_event(started("b", "n1"), 1.0)
    r.on_report(report("n1"), 2.0)
    r.on_report(report("n1", ("a", 1), ("b", 1)), 3.0)  # back in the list: counting restarts
    r.on_report(report("n1"), 4.0)
    assert r.lost(ledger, 4.0) == []
    r.on_event(Completed(job_id="a", time=0.0, node="n1"), 4.5)
    r.on_report(report("n1"), 5.0)
    assert [x.job_id for x in r.lost(ledger, 5.0)] == ["b"]


def test_a_silent_node_is_down_with_all_its_allocations_and_comes_back_on_a_report():
    r = Reconciler(ReconcileSettings(down_intervals=3), now=0.0)
    ledger = {"run": alloc("run", "n1"), "new": alloc("new", "n1", attempt=2)}
    r.on_event(started("run", "n1"), 0.1)
    r.on_report(report("n1", ("run", 1)), 1.0)
    r.on_report(report("n2"), 1.0)
    assert r.refresh_down({"n1", "n2"}, 3.5) == (set(), set())
    r.on_report(report("n2"), 3.9)
    went, back = r.refresh_down({"n1", "n2"}, 4.1)
    assert went == {"n1"} and back == set()
    lost = r.lost(ledger, 4.1)
    assert {x.job_id for x in lost} == {"run", "new"}  # started or not
    assert all(x.kind == "node_down" and "n1 down" in x.reason for x in lost)
    news = r.on_report(report("n1", boot="b2"), 5.0)
    assert news.came_up and news.rebooted
    assert r.refresh_down({"n1", "n2"}, 5.0) == (set(), set())


def test_nothing_is_down_while_no_executor_reports_at_all():
    r = Reconciler(now=0.0)
    assert r.refresh_down({"n1", "n2"}, 1000.0) == (set(), set())
    r.on_report(report("n1"), 1000.0)
    went, _ = r.refresh_down({"n1", "n2"}, 1000.5)
    assert went == {"n2"}  # silent since this placer started, while n1 does report


def test_a_node_reporting_an_attempt_we_do_not_expect_there_says_so():
    r = Reconciler(now=0.0)
    r.on_event(started("j", "n1", attempt=1), 0.0)
    r.on_event(Preempted(job_id="j", time=0.0, node="n1"), 0.5)
    r.on_event(started("j", "n2", attempt=2), 1.0)
    news = r.on_report(report("n1", ("j", 1)), 2.0)
    assert news.stale == (("j", 1),)
    assert r.on_report(report("n2", ("j", 2)), 2.0).stale == ()


def test_a_replayed_started_does_not_reset_the_count():
    r = Reconciler(ReconcileSettings(misses=2, grace_intervals=0), now=0.0)
    ledger = {"j": alloc("j", "n1")}
    r.on_event(started("j", "n1"), 0.0)
    r.on_report(report("n1"), 1.0)
    r.on_event(started("j", "n1"), 1.5)  # a duplicate
    r.on_report(report("n1"), 2.0)
    assert len(r.lost(ledger, 2.0)) == 1
