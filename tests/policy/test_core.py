"""``libs.policy.core.Scheduler``: the one scheduler both drivers feed, events in, decisions out."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from libs.policy.config import PolicyConfig
from libs.policy.core import Scheduler
from libs.policy.inventory import demo_cluster
from libs.policy.profiles import ProfileTable
from libs.policy.types import PendingJob
from libs.policy.wakeups import Wakeups
from proto.jobs import JobSpec

CFG = PolicyConfig.default()
NODES = demo_cluster()


def _sched(**cfg) -> Scheduler:
    import dataclasses

    return Scheduler(
        NODES, cfg=dataclasses.replace(CFG, **cfg), profiles=ProfileTable.default(), now=0.0
    )


def _start_all(s: Scheduler, now: float) -> list[str]:
    d = s.tick(now)
    for p in d.places:
        s.start_job(p.allocation.job_id, p.allocation, p.job.spec, now)
    return [p.job.spec.id for p in d.places]


def test_a_tick_places_what_fits_and_every_waiting_job_has_a_reason_with_numbers():
    s = _sched(power_saving=False)
    for i in range(80):
        s.queue_job(PendingJob(JobSpec(id=f"j{i}", gpus=2, gpu_mem_gb=20), 0.0))
    placed = _start_all(s, 0.0)
    assert placed and len(s.queue) == 80 - len(placed)
    reasons = s.reasons()
    assert set(reasons) == {j.spec.id for j in s.queue} and all(reasons.values())
    job = next(iter(reasons))
    w = s.explain(job, 0.0)
    assert w is not None and 1 <= w.rank <= w.queued == len(s.queue)
    assert w.best_node in {n.id for n in NODES} and w.lacks
    # changes are handed out once; nothing changes on an idle tick, nothing is handed again
    assert len(s.reason_changes(10_000)) == len(s.queue)
    _start_all(s, 1.0)
    assert s.reason_changes(10_000) == {}


def test_a_job_that_ends_frees_its_resources_for_the_next():
    s = _sched(power_saving=False)
    big = [JobSpec(id=f"b{i}", gpus=8, gpu_mem_gb=70) for i in range(5)]  # 4 A100 nodes
    for spec in big:
        s.queue_job(PendingJob(spec, 0.0))
    first = _start_all(s, 0.0)
    assert len(first) == 4 and _start_all(s, 50.0) == []
    s.end_job(first[0], 100.0)
    assert s.could_place_now()
    assert _start_all(s, 100.0) == [j for j in ("b0", "b1", "b2", "b3", "b4") if j not in first]


def test_the_pass_test_says_no_only_when_nothing_could_fit():
    s = _sched(power_saving=False)
    assert not s.could_place_now()  # nothing queued
    s.queue_job(PendingJob(JobSpec(id="huge", gpus=0.5, gpu_mem_gb=200), 0.0))
    assert not s.could_place_now()  # no GPU has 200 GB
    s.queue_job(PendingJob(JobSpec(id="half", gpus=0.5, gpu_mem_gb=10), 0.0))
    assert s.could_place_now()


def test_held_nodes_take_nothing_and_a_refused_suspend_is_taken_as_awake():
    s = _sched(power_saving=False)
    for n in NODES:
        s.set_cordoned(n.id, "operator", True)
    s.queue_job(PendingJob(JobSpec(id="a"), 0.0))
    assert _start_all(s, 0.0) == []
    s.set_cordoned(NODES[0].id, "operator", False)
    assert _start_all(s, 1.0) == ["a"]
    s.power_fact(NODES[1].id, "asleep", 2.0)
    assert s.power_state(NODES[1].id) == "asleep" and s.view.cordoned[1]
    s.power_fact(NODES[1].id, "awake", 3.0)
    assert s.power_state(NODES[1].id) == "awake"
    assert s.view.cordoned[1]  # the operator's hold stays


def test_idle_nodes_sleep_after_the_policy_time_and_wake_for_waiting_work():
    s = _sched()
    d = s.tick(0.0)
    assert d.suspend == () and d.next_tick_s == CFG.suspend_after_s
    d = s.tick(CFG.suspend_after_s)
    assert d.suspend, "idle nodes beyond the warm reserve sleep"
    asleep = set(d.suspend)
    for i in range(40):  # more than the awake nodes hold
        s.queue_job(PendingJob(JobSpec(id=f"w{i}", gpus=8, gpu_mem_gb=10), 400.0))
    d = s.tick(CFG.suspend_after_s + 100)
    assert d.wake and set(d.wake) <= asleep
    for node in d.wake:
        assert s.power_state(node) == "waking"
        s.node_resumed(node, 1000.0)
        assert s.power_state(node) == "awake"


def test_wakeups_keep_the_engines_rule():
    w = Wakeups()
    w.after_pass(0.0, 30.0)
    w.after_pass(1.0, 40.0)  # later than a pending one: not kept
    w.after_power(1.0, 20.0)
    assert w.next_s() == 20.0
    assert not w.due(20.0)  # a power instant wakes no pass
    assert w.due(30.0) and w.next_s() is None
    w.after_pass(30.0, 60.0)  # the pending pass instant fired: a new one is kept
    assert w.next_s() == 60.0


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["queue", "tick", "end", "cancel"]),
            st.sampled_from([0.25, 0.5, 1, 2, 4, 8]),
            st.integers(0, 30),
        ),
        min_size=1,
        max_size=60,
    )
)
def test_any_event_sequence_never_over_allocates_and_keeps_each_job_in_one_state(events):
    s = _sched()
    now = 0.0
    started: set[str] = set()
    for n, (kind, gpus, k) in enumerate(events):
        now += 17.0
        if kind == "queue":
            spec = JobSpec(id=f"e{n}", gpus=gpus, gpu_mem_gb=8.0)
            s.queue_job(PendingJob(spec, now))
        elif kind == "tick":
            started |= set(_start_all(s, now))
        elif started:
            job = sorted(started)[k % len(started)]
            (s.end_job if kind == "end" else s.cancel_job)(job, now)
            started.discard(job)
        v = s.view
        assert (v.gpu_free >= -1e-9).all() and (v.gpu_free <= 1 + 1e-9).all()
        assert (v.host_mem_free_gb >= -1e-9).all() and (v.cpus_free >= -1e-9).all()
        queued = {j.spec.id for j in s.queue}
        running = {a.job_id for a in s.running_allocations()}
        assert not queued & running and running == started


def test_a_job_no_pass_has_scored_is_explained_with_finite_numbers():
    import math

    s = _sched(power_saving=False)
    for i in range(9):  # fill the four A100 nodes; the ninth waits
        s.queue_job(PendingJob(JobSpec(id=f"f{i}", gpus=8, gpu_mem_gb=70), 0.0))
    _start_all(s, 0.0)
    s.queue_job(PendingJob(JobSpec(id="late", gpus=8, gpu_mem_gb=70), 5.0))  # no pass since
    w = s.explain("late", 5.0)
    assert w is not None and math.isfinite(w.score) and w.rank == w.queued
