"""Gangs (``stages.gang``, ``gang_pass``): a job wider than any node gets every GPU it asks on
the fewest nodes of one model, all or nothing, never over a node's free resources; near each
other where the cluster says which nodes share a switch; and a blocked gang holds a reservation
small jobs may not delay."""

from __future__ import annotations

import itertools

import msgspec
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.core import Scheduler
from libs.policy.gang_pass import gang_place
from libs.policy.profiles import ProfileTable
from libs.policy.stages import gang as G
from libs.policy.stages.preempt import protection
from libs.policy.types import PendingJob
from proto.jobs import JobSpec
from proto.ledger import node_allocations
from proto.nodes import NodeSpec
from tests.policy.strategies import node_spec

PROFILES = ProfileTable.default()
CFG = PolicyConfig.default()


def labelled(nid: str, switch: str | None, gpus: int = 8, model: str = "a100-80gb") -> NodeSpec:
    n = node_spec(nid, gpus, model, 80.0 if model.startswith("a100") else 32.0)
    return NodeSpec(**{**{f: getattr(n, f) for f in n.__struct_fields__}, "labels": (
        {G.SWITCH_LABEL: switch} if switch else {})})  # fmt: skip


@st.composite
def busy_clusters(draw):
    """Up to 6 nodes of two models (4 or 8 GPUs, two switches), some GPUs, host memory and
    CPUs already taken by one-node jobs."""
    n = draw(st.integers(2, 6))
    nodes = []
    for i in range(n):
        model = draw(st.sampled_from(["a100-80gb", "v100-32gb"]))
        nodes.append(
            NodeSpec(
                id=f"n{i}",
                gpu_model=model,
                gpu_count=draw(st.sampled_from([4, 8])),
                gpu_mem_gb=80.0 if model == "a100-80gb" else 32.0,
                host_mem_gb=float(draw(st.sampled_from([64, 256]))),
                cpus=draw(st.sampled_from([16, 64])),
                idle_power_w=30.0,
                max_power_w=300.0,
                labels={G.SWITCH_LABEL: draw(st.sampled_from(["s0", "s1"]))},
            )
        )
    view = ClusterView.build(nodes)
    for i, nd in enumerate(nodes):  # a one-node job on a prefix of each node's GPUs
        taken = draw(st.integers(0, nd.gpu_count))
        if taken:
            host = float(draw(st.sampled_from([0, 16, 48])))
            view.allocate(_one_node(f"busy{i}", nd.id, taken, host))
    spec = JobSpec(
        id="gang",
        gpus=float(draw(st.sampled_from([9, 12, 16, 20, 24]))),
        gpu_mem_gb=float(draw(st.sampled_from([8, 30, 60]))),
        host_mem_gb=float(draw(st.sampled_from([16, 96, 320]))),
        cpus=float(draw(st.sampled_from([8, 48]))),
    )
    return view, spec


def _one_node(jid: str, node: str, gpus: int, host: float):
    from proto.ledger import Allocation

    return Allocation(
        job_id=jid, node=node, gpu_indices=tuple(range(gpus)), gpu_share=1.0,
        gpu_mem_gb=8.0, host_mem_gb=host, cpus=1.0, time=0.0,
    )  # fmt: skip


def _fewest_by_search(view: ClusterView, spec: JobSpec) -> int | None:
    """The fewest nodes of one model whose free whole GPUs, host memory and CPUs could hold
    the gang (every subset tried: the definition the greedy choice must meet)."""
    k = round(spec.gpus)
    host, cpu = spec.host_mem_gb / k, spec.cpus / k
    ok = [
        i
        for i in range(len(view.node_ids))
        if view.gpu_mem_gb[i] >= spec.gpu_mem_gb - EPS and not view.cordoned[i]
    ]
    offer = {
        i: min(
            int(view.whole_free[i]),
            int((view.host_mem_free_gb[i] + EPS) // host) if host else 99,
            int((view.cpus_free[i] + EPS) // cpu) if cpu else 99,
        )
        for i in ok
    }
    for size in range(1, len(ok) + 1):
        for combo in itertools.combinations(ok, size):
            one_model = len({int(view.model_idx[i]) for i in combo}) == 1
            if one_model and sum(offer[i] for i in combo) >= k:
                return size
    return None


@settings(max_examples=150, deadline=None)
@given(busy_clusters())
def test_gang_all_or_nothing_fewest_nodes_one_model_never_over(case):
    view, spec = case
    if not G.is_gang(spec, view):
        return
    before = (view.gpu_free.copy(), view.host_mem_free_gb.copy(), view.cpus_free.copy())
    res = gang_place(spec, view, PROFILES, CFG)
    fewest = _fewest_by_search(view, spec)
    assert (res is None) == (fewest is None)  # all or nothing: exactly when some set holds it
    if res is None:
        return
    parts = res.parts
    assert len(parts) == fewest
    assert sum(len(p.gpu_indices) for p in parts) == round(spec.gpus)
    assert len({int(view.model_idx[p.node_index]) for p in parts}) == 1
    assert len({p.node_index for p in parts}) == len(parts)
    from libs.policy.gang_pass import gang_allocation

    alloc = gang_allocation(spec, res, 0.0, 1)
    for a in node_allocations(alloc):  # each part fits what its node has free
        i = view.index[a.node]
        assert all(view.gpu_free[i, j] >= 1.0 - EPS for j in a.gpu_indices)
        assert a.host_mem_gb <= view.host_mem_free_gb[i] + 1e-6
        assert a.cpus <= view.cpus_free[i] + 1e-6
        assert view.gpu_mem_gb[i] >= spec.gpu_mem_gb
    view.allocate(alloc)
    assert (view.gpu_free >= -EPS).all() and (view.host_mem_free_gb >= -1e-6).all()
    assert (view.cpus_free >= -1e-6).all()
    view.release(alloc)
    assert np.allclose(view.gpu_free, before[0]) and np.allclose(view.host_mem_free_gb, before[1])
    assert np.allclose(view.cpus_free, before[2])


@st.composite
def workloads(draw):
    jobs = []
    for i in range(draw(st.integers(1, 12))):
        gpus = float(draw(st.sampled_from([1, 2, 4, 8, 12, 16, 24])))
        jobs.append(
            JobSpec(
                id=f"j{i}",
                gpus=gpus,
                gpu_mem_gb=8.0,
                host_mem_gb=4.0 * gpus,
                cpus=gpus,
                priority=draw(st.integers(0, 9)),
                est_runtime_s=float(draw(st.sampled_from([60, 600, 3600]))),
            )
        )
    ends = draw(st.lists(st.integers(0, 11), max_size=6))
    return jobs, ends


@settings(max_examples=60, deadline=None)
@given(workloads())
def test_scheduler_with_gangs_never_over_allocates_and_gives_everything_back(case):
    """Passes over a queue of one-node jobs and gangs, with ends between them: every placement
    holds exactly its GPUs on nodes of one model, the view never goes below zero, and once
    every job ended the cluster is whole again."""
    jobs, ends = case
    nodes = [labelled(f"a{i}", f"s{i // 2}") for i in range(4)] + [
        labelled(f"v{i}", "sv", 4, "v100-32gb") for i in range(2)
    ]
    s = Scheduler(nodes, cfg=CFG, profiles=PROFILES)
    for j in jobs:
        assert s.can_ever_place(j)
        s.queue_job(PendingJob(j, 0.0))
    running: list[str] = []
    for step, end in enumerate([*ends, None, None, None, None, None, None]):
        for p in s.schedule_pass(float(step)):
            parts = node_allocations(p.allocation)
            assert sum(len(a.gpu_indices) for a in parts) == round(p.job.spec.gpus)
            assert len({s.view.nodes[s.view.index[a.node]].gpu_model for a in parts}) == 1
            s.start_job(p.job.spec.id, p.allocation, p.job.spec, float(step))
            running.append(p.job.spec.id)
        v = s.view
        assert (v.gpu_free >= -EPS).all() and (v.host_mem_free_gb >= -1e-6).all()
        assert (v.cpus_free >= -1e-6).all()
        if running:
            s.end_job(running.pop(0 if end is None else end % len(running)), float(step))
    while running:
        s.end_job(running.pop(), 99.0)
    assert (s.view.whole_free == s.view.gpu_total).all()
    assert np.allclose(s.view.host_mem_free_gb, s.view.host_mem_gb)
    assert len(s.running) == 0


def test_gang_prefers_one_switch_over_more_free_nodes_elsewhere():
    """16 GPUs on 8-GPU nodes: a0 and a3 hang off s0 (a3 partly busy), a1 and a2 off s1 (both
    free), a4 alone off s2. The first free nodes in node order (a0, a1) would span two
    switches; the gang takes the two free nodes of s1."""
    nodes = [
        labelled("a0", "s0"),
        labelled("a1", "s1"),
        labelled("a2", "s1"),
        labelled("a3", "s0"),
        labelled("a4", "s2"),
    ]
    view = ClusterView.build(nodes)
    view.allocate(_one_node("busy", "a3", 2, 0.0))  # s0 keeps one free node only
    res = gang_place(JobSpec(id="g", gpus=16, gpu_mem_gb=8), view, PROFILES, CFG)
    assert res is not None
    assert sorted(p.node_id for p in res.parts) == ["a1", "a2"]  # both on s1
    assert res.terms["switches"] == 1.0


def test_gang_spreads_over_switches_only_when_no_switch_holds_it():
    nodes = [labelled(f"a{i}", f"s{i}") for i in range(3)]
    res = gang_place(
        JobSpec(id="g", gpus=16, gpu_mem_gb=8), ClusterView.build(nodes), PROFILES, CFG
    )
    assert res is not None and len(res.parts) == 2 and res.terms["switches"] == 2.0


def test_gang_remainder_goes_on_the_last_node_and_host_memory_is_split_by_gpu():
    nodes = [labelled(f"a{i}", "s0") for i in range(2)]
    view = ClusterView.build(nodes)
    s = Scheduler(nodes, cfg=CFG, profiles=PROFILES)
    spec = JobSpec(id="g", gpus=12, gpu_mem_gb=8, host_mem_gb=120, cpus=24)
    s.queue_job(PendingJob(spec, 0.0))
    (p,) = s.schedule_pass(0.0)
    parts = node_allocations(p.allocation)
    assert [len(a.gpu_indices) for a in parts] == [8, 4]
    assert [a.host_mem_gb for a in parts] == [80.0, 40.0] and [a.cpus for a in parts] == [16, 8]
    del view


def test_blocked_gang_reserves_its_nodes_and_small_long_jobs_wait():
    """Two 8-GPU nodes, a 4-GPU job runs on a0 until t=1000; a 16-GPU gang waits for it. A
    long 4-GPU job arriving behind the gang would delay it: it waits (Reserved); a short one
    that ends before t=1000 backfills."""
    nodes = [labelled("a0", "s0"), labelled("a1", "s0")]
    s = Scheduler(nodes, cfg=CFG, profiles=PROFILES)
    model = "a100-80gb"
    run_s = PROFILES.runtime_s(JobSpec(id="x", est_runtime_s=1000.0), model)
    first = JobSpec(id="first", gpus=4, est_runtime_s=1000.0 * 1000.0 / run_s)
    s.queue_job(PendingJob(first, 0.0))
    (p,) = s.schedule_pass(0.0)
    s.start_job("first", p.allocation, first, 0.0)
    s.queue_job(PendingJob(JobSpec(id="gang", gpus=16, priority=9), 1.0))
    s.queue_job(PendingJob(JobSpec(id="long", gpus=4, priority=0, est_runtime_s=1e6), 2.0))
    short = JobSpec(id="short", gpus=4, priority=0, est_runtime_s=1.0)
    s.queue_job(PendingJob(short, 3.0))
    placed = {p.job.spec.id for p in s.schedule_pass(100.0)}  # a backfill pass (cadence)
    assert placed == {"short"}
    assert s.reason_of("gang") == "Resources"
    assert s.reason_of("long") == "Reserved"
    res = s.last
    held = {res.reservation.node_id, *(r.node_id for r in res.extra_reservations)}
    assert held == {"a0", "a1"}


def test_gang_parts_are_never_preempted():
    nodes = [labelled("a0", "s0"), labelled("a1", "s0")]
    s = Scheduler(nodes, cfg=CFG, profiles=PROFILES)
    spec = JobSpec(id="g", gpus=16, checkpointable=True)
    s.queue_job(PendingJob(spec, 0.0))
    assert len(s.schedule_pass(0.0)) == 1
    for rj in s.running:
        assert "gang" in protection(rj, None, 1e6, CFG.preempt)


def test_gang_wider_than_every_model_never_fits():
    nodes = [labelled("a0", "s0"), labelled("a1", "s0")]
    s = Scheduler(nodes, cfg=CFG, profiles=PROFILES)
    assert s.can_ever_place(JobSpec(id="ok", gpus=16))
    assert not s.can_ever_place(JobSpec(id="wide", gpus=24))
    assert not s.can_ever_place(JobSpec(id="host", gpus=16, host_mem_gb=2000.0))


@st.composite
def gang_waves(draw):
    """Three waves of queued jobs, some wider than a node, some the same shape."""
    shapes = [(1, 8.0), (2, 16.0), (4, 40.0), (8, 8.0), (12, 8.0), (16, 40.0), (24, 8.0)]
    waves = []
    for w in range(3):
        wave = []
        for i in range(draw(st.integers(1, 10))):
            gpus, mem = draw(st.sampled_from(shapes))
            wave.append(
                JobSpec(
                    id=f"w{w}-{i}",
                    gpus=float(gpus),
                    gpu_mem_gb=mem,
                    host_mem_gb=4.0 * gpus,
                    cpus=float(gpus),
                    priority=draw(st.integers(0, 9)),
                    est_runtime_s=float(draw(st.sampled_from([60, 3600, 36000]))),
                )
            )
        waves.append(wave)
    return waves


@settings(max_examples=40, deadline=None)
@given(gang_waves())
def test_the_bulk_walk_with_gangs_starts_what_the_row_by_row_walk_starts(waves):
    """The bulk walk's screen leaves gang shapes alone (``fast.screen.DeadRows``): with gangs
    queued it starts the same jobs, on the same nodes, with the same reservations, as the walk
    that visits every row and as a fully ranked pass."""
    from libs.policy.fast import walk as W
    from libs.policy.gang_pass import running_of
    from libs.policy.queue import PendingQueue
    from libs.policy.scheduler import schedule

    nodes = [labelled(f"a{i}", f"s{i // 2}") for i in range(4)]
    nodes += [labelled(f"v{i}", "sv", 4, "v100-32gb") for i in range(3)]
    qs = [PendingQueue() for _ in range(3)]
    views = [ClusterView.build(nodes) for _ in qs]
    runs: list[list] = [[] for _ in qs]
    now = 0.0
    for wave in waves:
        now += 100.0
        for s in wave:
            for q in qs:
                q.add(PendingJob(s, now))
        kw = {"now": now, "tenant_usage": {}, "profiles": PROFILES, "cfg": CFG}
        bulk = schedule(qs[0], views[0], runs[0], reasons=False, **kw)
        W.BULK_SKIP = False
        try:
            rows = schedule(qs[1], views[1], runs[1], reasons=False, **kw)
        finally:
            W.BULK_SKIP = True
        full = schedule(qs[2], views[2], runs[2], reasons=True, **kw)

        def key(res):
            placed = [
                (j.spec.id, tuple((p.node_id, p.gpu_indices) for p in getattr(pl, "parts", (pl,))))
                for j, pl in res.assignments
            ]
            resv = [(r.job_id, r.node_id, r.start) for r in res.extra_reservations]
            head = res.reservation
            return placed, None if head is None else (head.job_id, head.node_id), resv

        assert key(bulk) == key(rows) == key(full)
        for res, q, view, rl in zip((bulk, rows, full), qs, views, runs, strict=True):
            for j, pl in res.assignments:
                q.remove(j.spec.id)
                alloc = view_alloc(j.spec, pl, now)
                rl.extend(running_of(alloc, j.spec, pl, view, now + 50.0))


def view_alloc(spec, placement, now):
    from libs.policy.gang_pass import allocation_of

    return allocation_of(spec, placement, now, 1)[0]


@settings(max_examples=60, deadline=None)
@given(busy_clusters(), st.data())
def test_gang_offers_memo_follows_the_definition_as_nodes_change(case, data):
    """``fast.gang_offers`` (offers kept on the view, refreshed only at nodes whose
    ``node_gen`` moved) gives, after starts, ends, cordons and temperature changes, the
    definition's offers over the available nodes and its ``can_hold`` per GPU count."""
    from libs.policy.fast.gang_offers import offers_now
    from libs.policy.filters import available

    view, spec = case
    one = [_one_node(f"x{i}", nid, 1, 16.0) for i, nid in enumerate(view.node_ids)]
    held: list = []
    for step in data.draw(st.lists(st.integers(0, 3), max_size=12), label="steps"):
        i = data.draw(st.integers(0, len(view.node_ids) - 1), label="node")
        nid = view.node_ids[i]
        if step == 0 and view.whole_free[i] == view.gpu_total[i]:  # a start on a free node
            view.allocate(one[i])
            held.append(one[i])
        elif step == 1 and held:  # an end
            view.release(held.pop())
        elif step == 2:
            view.set_cordoned(nid, not view.cordoned[i])
        else:
            view.set_temp(nid, data.draw(st.sampled_from([40.0, CFG.thermal_max_c + 5.0])))
        if not data.draw(st.booleans(), label="ask now"):  # changes pile up: a wide refresh
            continue
        memo = offers_now(spec, view, CFG)
        want = G.offers(spec, view, available(view, CFG))
        assert memo.offer.tolist() == want.tolist()
        sums = np.bincount(view.model_idx, weights=want, minlength=len(view.models))
        for k in {1, round(spec.gpus), *(int(x) + d for x in sums for d in (0, 1))}:
            assert memo.can_hold(k) == G.can_hold(k, want, view)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 4), st.floats(0.0, 100.0), st.booleans()), max_size=25),
    st.floats(0.0, 100.0),
)
def test_free_at_kept_by_the_running_set_is_the_definitions(ops, now):
    """``gang_pass.free_at`` (the running set's last ends, kept as jobs start and end, also on
    a pass's overlay over a base set) is ``stages.gang.node_free_at`` of every node."""
    from libs.policy import backfill as B
    from libs.policy.gang_pass import free_at
    from libs.policy.types import RunningJob

    view = ClusterView.build([labelled(f"n{i}", None) for i in range(5)])
    spec = JobSpec(id="j", gpus=1.0, gpu_mem_gb=1.0)
    base = B.RunningSet()
    sets, own = [base], [[]]  # each set's own jobs (an overlay removes only its own)
    for k, (node, end, drop) in enumerate(ops):
        rel, mine = sets[-1], own[-1]
        if drop and mine:  # an end, the oldest of the set's own jobs
            rel.remove(mine.pop(0))
        else:
            rel.add(RunningJob(msgspec.structs.replace(spec, id=f"j{k}"), node, (0,), 1.0, end))
            mine.append(f"j{k}")
        if k == len(ops) // 2:  # the rest goes on a pass's overlay
            free_at(view, base, now)  # built on the base first, so the overlay copies it
            sets.append(B.RunningSet([], base=base))
            own.append([])
        for r in sets:
            want = [G.node_free_at(r.on_node(n), now) for n in range(len(view.node_ids))]
            assert free_at(view, r, now).tolist() == want


def test_a_kept_demand_plans_blocked_gangs_as_a_fresh_one():
    """``power.Demand.gang_needs`` (the blocked gangs' power rule kept per sleeping set) gives
    the plan a fresh ``Demand`` gives, as nodes fall asleep and wake in any order."""
    from libs.policy import power

    nodes = [labelled(f"a{i}", f"s{i // 2}") for i in range(4)]
    nodes += [labelled(f"v{i}", None, 4, "v100-32gb") for i in range(4)]
    view = ClusterView.build(nodes)
    gangs = [JobSpec(id="g1", gpus=12.0, gpu_mem_gb=8.0), JobSpec(id="g2", gpus=10.0)]
    kept = power.Demand.of(gangs, CFG.power_demand_cap)
    rng = np.random.default_rng(15)
    n = len(view.node_ids)
    for _ in range(30):
        suspended = rng.random(n) < 0.5
        args = dict(
            idle_s=np.full(n, 1e6), suspended=suspended, resuming=np.zeros(n, dtype=bool),
            reserved=(), cfg=CFG,
        )  # fmt: skip
        fresh = power.Demand.of(gangs, CFG.power_demand_cap)
        assert power.plan(view, blocked=kept, **args) == power.plan(view, blocked=fresh, **args)
