"""Scheduling pass and EASY backfill: the reservation is never delayed, strict order without
backfill, never-fitting jobs do not block, the view is updated in place, the queue class and a
plain list agree."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.policy import gang_pass as GP
from libs.policy.backfill import RunningSet, _earliest_start_jobs, reserve
from libs.policy.cadence import BackfillCadence
from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.placement import to_allocation
from libs.policy.profiles import ProfileTable
from libs.policy.queue import PendingQueue
from libs.policy.scheduler import schedule
from libs.policy.stages.gang import PART_SEP, is_gang, node_free_at
from libs.policy.types import PendingJob, Placement, RunningJob
from libs.sim.perf import bench_schedule
from proto.jobs import JobSpec
from tests.policy.strategies import busy_view, jobs, node_spec

P = ProfileTable.default()
CFG = PolicyConfig.default()
# the hand cases' order by priority alone (no shortness term, stages.rank): the job named
# "head" leads though the jobs below it are shorter, which is what they test backfill against
BLIND = dataclasses.replace(CFG, w_short=0.0)


def _run(view: ClusterView, jid: str, node: str, idx: tuple[int, ...], end: float) -> RunningJob:
    spec = JobSpec(id=jid, gpus=len(idx), gpu_mem_gb=1, host_mem_gb=1, cpus=1)
    p = Placement(view.index[node], node, idx, 1.0, 0.0, {})
    view.allocate(to_allocation(spec, p, 0.0))
    return RunningJob(spec, view.index[node], idx, 1.0, end)


def _job(jid: str, gpus: float, runtime: float, prio: int) -> PendingJob:
    return PendingJob(
        JobSpec(
            id=jid,
            gpus=gpus,
            gpu_mem_gb=1,
            host_mem_gb=1,
            cpus=1,
            priority=prio,
            est_runtime_s=runtime,
        ),
        0.0,
    )


def _sched(pending, view, running, cfg=CFG, **kw):
    return schedule(pending, view, running, now=0.0, tenant_usage={}, profiles=P, cfg=cfg, **kw)


def _hand_case():
    v = ClusterView.build([node_spec("n0", 4)])
    running = [_run(v, "r1", "n0", (0, 1), 1000.0), _run(v, "r2", "n0", (2,), 5000.0)]
    return v, running  # GPU 3 free now; GPUs 0,1 free at t=1000


def test_backfill_refuses_a_job_that_would_delay_the_reservation():
    v, running = _hand_case()
    res = _sched([_job("head", 3, 3600, 9), _job("long", 1, 2000, 1)], v, running, cfg=BLIND)
    assert res.assignments == []
    assert res.reservation is not None
    assert (res.reservation.job_id, res.reservation.node_id) == ("head", "n0")
    assert res.reservation.start == 1000.0
    assert res.waiting == {"head": "Resources", "long": "Reserved"}


def test_backfill_lets_a_job_that_ends_before_the_reservation_run():
    v, running = _hand_case()
    res = _sched([_job("head", 3, 3600, 9), _job("short", 1, 500, 1)], v, running)
    assert [(j.spec.id, p.gpu_indices) for j, p in res.assignments] == [("short", (3,))]
    assert v.free_gpus()[0] == 0  # the view was updated in place


def test_backfill_may_use_gpus_the_reservation_does_not_need():
    v = ClusterView.build([node_spec("n0", 8)])
    running = [_run(v, "r1", "n0", (0, 1, 2, 3), 1000.0)]
    ok = _sched([_job("head", 6, 3600, 9), _job("two", 2, 99999, 1)], v.copy(), running)
    assert [j.spec.id for j, _ in ok.assignments] == ["two"]  # 8 - 2 = 6 free at t=1000
    bad = _sched([_job("head", 6, 3600, 9), _job("three", 3, 99999, 1)], v.copy(), running)
    assert bad.assignments == [] and bad.waiting["three"] == "Reserved"


def test_without_backfill_the_queue_is_strict():
    v, running = _hand_case()
    cfg = dataclasses.replace(BLIND, backfill=False)
    res = _sched([_job("head", 3, 3600, 9), _job("short", 1, 500, 1)], v, running, cfg=cfg)
    assert res.assignments == [] and res.waiting["short"] == "Priority"


def test_a_pass_between_backfill_times_stops_at_the_blocked_head():
    v, running = _hand_case()
    pending = [_job("head", 3, 3600, 9), _job("short", 1, 500, 1)]
    between = _sched(pending, v.copy(), running, cfg=BLIND, backfill=False)
    assert between.assignments == [] and between.waiting["short"] == "Priority"
    due = _sched(pending, v.copy(), running, cfg=BLIND, backfill=True)
    assert [j.spec.id for j, _ in due.assignments] == ["short"]


def test_backfill_cadence_lets_one_pass_per_interval_backfill():
    c = BackfillCadence(30.0)
    assert [c.take(t) for t in (0.0, 10.0, 29.9, 30.0, 45.0, 61.0)] == [
        True,
        False,
        False,
        True,
        False,
        True,
    ]
    assert c.next_s == 91.0
    always = BackfillCadence(0.0)
    assert all(always.take(t) for t in (0.0, 0.0, 1.0))


def test_a_job_that_never_fits_does_not_block_the_queue():
    v = ClusterView.build([node_spec("n0", 4)])
    res = _sched([_job("huge", 16, 10, 9), _job("small", 1, 10, 1)], v, [])
    assert [j.spec.id for j, _ in res.assignments] == ["small"]
    assert res.waiting["huge"].startswith("GpuCount") and res.reservation is None


def test_everything_fits_on_an_empty_cluster_in_rank_order():
    v = ClusterView.build([node_spec("n0", 8), node_spec("n1", 8)])
    pend = [_job(f"j{i}", 1 + i % 3, 100, i % 10) for i in range(8)]
    res = _sched(pend, v, [])
    assert len(res.assignments) == 8 and res.waiting == {}
    assert [j.spec.id for j, _ in res.assignments] == [pend[int(i)].spec.id for i in res.rank.order]
    assert v.load() == sum(j.spec.gpus for j in pend) / 16


@st.composite
def busy_cluster(draw):
    v, running = draw(busy_view())
    pending = [PendingJob(s, -float(i)) for i, s in enumerate(draw(jobs(prefix="q")))]
    return v, running, pending


@settings(max_examples=50, deadline=None)
@given(busy_cluster())
def test_backfill_never_delays_the_reservation_and_never_overallocates(case):
    v, running, pending = case
    before = v.copy()
    res = _sched(pending, v, running, want_reservation=True)
    assert (v.gpu_free >= -1e-9).all() and (v.cpus_free >= -1e-9).all()
    assert (v.host_mem_free_gb >= -1e-9).all()
    for j, p in res.assignments:
        assert v.gpu_mem_gb[p.node_index] >= j.spec.gpu_mem_gb
    if res.reservation is None:
        return
    head = next(j for j in pending if j.spec.id == res.reservation.job_id)
    rank_pos = {pending[int(i)].spec.id: k for k, i in enumerate(res.rank.order)}
    started = [  # a gang started by the pass holds a part on each of its nodes
        rj
        for j, p in res.assignments
        for rj in GP.running_of(
            GP.allocation_of(j.spec, p, 0.0, j.attempt)[0],
            j.spec,
            p,
            v,
            P.runtime_s(j.spec, v.models[v.model_idx[p.node_index]]),
        )
    ]
    # jobs ranked above the head legitimately start first; the reservation is made after them
    pre = [r for r in started if rank_pos[r.spec.id.split(PART_SEP)[0]] < rank_pos[head.spec.id]]
    for r in pre:
        before.allocate(_alloc(before, r))
    again = _reserve(head, before, [*running, *pre])
    assert again is not None and again.start == res.reservation.start
    # ... and everything backfilled behind it does not push it later
    after = _reserve(head, v, [*running, *started])
    assert after is not None and after.start <= res.reservation.start + 1e-9


def _reserve(head: PendingJob, view: ClusterView, running: list[RunningJob]):  # type: ignore[no-untyped-def]
    """The head's reservation as the pass makes it: a gang's (its first node's) or one node's."""
    if is_gang(head.spec, view):
        from libs.policy.gang_pass import reserve as gang_reserve

        rs = gang_reserve(head, view, RunningSet(running), [], 0.0, CFG)
        return rs[0] if rs else None
    return reserve(head.spec.id, head.spec, view, running, now=0.0, cfg=CFG)


def _alloc(view: ClusterView, r: RunningJob):
    node = view.node_ids[r.node_index]
    p = Placement(r.node_index, node, r.gpu_indices, r.gpu_share, 0.0, {})
    return to_allocation(r.spec, p, 0.0)


@settings(max_examples=20, deadline=None)
@given(busy_cluster())
def test_deterministic_and_queue_equals_list(case):
    v, running, pending = case
    a = _sched(pending, v.copy(), running)
    b = _sched(pending, v.copy(), running)
    c = _sched(PendingQueue(pending), v.copy(), running)
    key = [(j.spec.id, p.node_id, p.gpu_indices) for j, p in a.assignments]
    assert key == [(j.spec.id, p.node_id, p.gpu_indices) for j, p in b.assignments]
    assert key == [(j.spec.id, p.node_id, p.gpu_indices) for j, p in c.assignments]
    assert a.waiting == c.waiting and (a.rank is None) == (c.rank is None)
    if a.rank is not None:  # None: the pass exited early (no request fits any free block)
        assert np.array_equal(a.rank.scores, c.rank.scores)


def test_bench_runs():
    assert bench_schedule(10, 20, 2) > 0


@settings(max_examples=50, deadline=None)
@given(busy_cluster(), st.integers(1, 5))
def test_backfill_never_delays_any_of_several_reservations(case, k):
    """With ``reservations`` = k, every reserved job's earliest start on its node, after the
    pass, is no later than its reservation said; reserved nodes are distinct."""
    v, running, pending = case
    cfg = dataclasses.replace(CFG, reservations=k)
    res = _sched(pending, v, running, cfg=cfg, want_reservation=True)
    assert (v.gpu_free >= -1e-9).all() and (v.cpus_free >= -1e-9).all()
    resv = [r for r in (res.reservation, *res.extra_reservations) if r is not None]
    assert len({r.job_id for r in resv}) <= k  # a gang's one reservation holds several nodes
    assert len({r.node_index for r in resv}) == len(resv)
    by_id = {j.spec.id: j for j in pending}
    started = [  # a gang started by the pass holds a part on each of its nodes
        rj
        for j, p in res.assignments
        for rj in GP.running_of(
            GP.allocation_of(j.spec, p, 0.0, j.attempt)[0],
            j.spec,
            p,
            v,
            P.runtime_s(j.spec, v.models[v.model_idx[p.node_index]]),
        )
    ]
    rel = RunningSet([*running, *started])
    for r in resv:
        spec = by_id[r.job_id].spec
        assert r.job_id not in {j.spec.id for j, _ in res.assignments}
        if is_gang(spec, v):  # its reserved nodes are all empty by its start
            t = node_free_at(rel.on_node(r.node_index), 0.0)
        else:
            t = _earliest_start_jobs(spec, v, r.node_index, rel.on_node(r.node_index), 0.0)
        assert t <= r.start + 1e-9, (r, t)


def test_reservation_ties_go_to_the_lowest_node_whatever_the_visiting_order():
    """Both nodes can take the 2-GPU head at t=300; n1 frees a GPU first (t=120), so it is
    visited first, but the answer is n0: the visiting order moves with ``now`` (overdue jobs
    count as ending now) and a memoised reservation must equal a fresh one."""
    v = ClusterView.build([node_spec("n0", 2), node_spec("n1", 2)])
    running = [
        _run(v, "a", "n0", (0, 1), 300.0),
        _run(v, "b", "n1", (0,), 120.0),
        _run(v, "c", "n1", (1,), 300.0),
    ]
    head = _job("head", 2, 3600, 9).spec
    for now in (100.0, 200.0):
        r = reserve("head", head, v, running, now=now, cfg=CFG)
        assert r is not None and (r.node_id, r.start) == ("n0", 300.0)


def test_a_long_job_that_fits_nowhere_waits_on_resources_and_gets_the_reservation():
    """A 40 GB, 10-hour job: the A100 node is full (frees at t=1000) and only a T4 GPU (16 GB,
    too small and too slow) is free. It fits on no node at all, so it waits on Resources and is
    the head job the reservation protects, as the failed-shape memo would also say; SlowGPU is
    only for a job that fits now, but only on GPUs too slow for it."""

    v = ClusterView.build([node_spec("a", 1, "a100-80gb", 80.0), node_spec("t", 1, "t4", 16.0)])
    running = [_run(v, "busy", "a", (0,), 1000.0)]
    spec = JobSpec(id="long", gpus=1, gpu_mem_gb=40, est_runtime_s=36000.0, priority=5)
    res = _sched([PendingJob(spec, 0.0)], v, running, want_reservation=True)
    assert res.waiting == {"long": "Resources"}
    assert res.reservation is not None and res.reservation.job_id == "long"


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(0, 5), st.sampled_from([5.0, 10.0, 10.0, 30.0])),
        min_size=1,
        max_size=40,
    ),
    st.booleans(),
)
def test_running_set_first_end_array_follows_the_jobs(ops, overlay):
    """``RunningSet.first_end_array`` (kept up to date by add/remove once built) always equals
    the earliest expected end per node computed from the jobs on it, also for an overlay."""
    base = RunningSet()
    rs = RunningSet(base=base) if overlay else base
    live: dict[str, RunningJob] = {}
    for k, (add, node, end) in enumerate(ops):
        if add or not live:
            spec = JobSpec(id=f"j{k}", tenant="t", gpus=1.0, gpu_mem_gb=1.0)
            r = RunningJob(spec, node, (0,), 1.0, end)
            rs.add(r)
            live[r.spec.id] = r
        else:
            jid = sorted(live)[k % len(live)]
            rs.remove(jid)
            del live[jid]
        want = np.full(6, np.inf)
        for r in live.values():
            want[r.node_index] = min(want[r.node_index], r.expected_end)
        assert rs.first_end_array(6).tolist() == want.tolist()
