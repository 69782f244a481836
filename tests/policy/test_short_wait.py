"""The short-wait rule (``stages.short_wait``): when it fires, and every case it must not."""

from __future__ import annotations

import dataclasses
from collections import Counter

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig, PreemptConfig
from libs.policy.queue import PendingQueue
from libs.policy.scores import CLASS_INDEX
from libs.policy.stages import preempt as P
from libs.policy.stages import short_wait as SW
from libs.policy.types import PendingJob, RunningJob
from proto.jobs import WORKLOAD_CLASSES, Elastic, JobSpec
from proto.ledger import Allocation
from tests.policy.strategies import derandomized, node_spec
from tests.policy.test_preempt import cluster

NOW = 100_000.0
CFG = dataclasses.replace(PolicyConfig.default(), preempt=PreemptConfig())
H = 3600.0
PLANS: list[bool] = []  # whether each example of the property found a plan
LOOKS: list[int] = []  # how many plans each example of the several-plans property found


def _speed(view: ClusterView) -> np.ndarray:
    return np.ones((len(view.models), len(WORKLOAD_CLASSES)))


def _alloc(spec: JobSpec, node: str, gpus: tuple[int, ...]) -> Allocation:
    return Allocation(
        job_id=spec.id, node=node, gpu_indices=gpus, gpu_share=1.0, gpu_mem_gb=4.0,
        host_mem_gb=1.0, cpus=1.0, time=0.0, attempt=1, spec=spec,
    )  # fmt: skip


def _setup(victims: list[tuple[JobSpec, float]], n1_full: bool = False):  # type: ignore[no-untyped-def]
    """n0 (8 GPUs) holds ``victims`` (spec, expected end), one GPU each from 0 or all 8 for
    an 8-GPU one; n1 (8 GPUs free, 16 CPUs) is where they may resume: too few CPUs for the
    blocked job (64), so it cannot start there itself."""
    ns = [node_spec("n0", gpus=8), node_spec("n1", gpus=8, cpus=16)]
    view = ClusterView.build(ns)
    running, g = [], 0
    for spec, end in victims:
        k = int(spec.gpus)
        a = _alloc(spec, "n0", tuple(range(g, g + k)))
        g += k
        view.allocate(a)
        running.append(RunningJob.from_allocation(a, 0, end))
    if n1_full:  # a job that may not move holds n1: no room elsewhere for a victim
        plain = JobSpec(id="p", gpus=8, gpu_mem_gb=4.0, host_mem_gb=1.0, cpus=1.0)
        view.allocate(_alloc(plain, "n1", tuple(range(8))))
    return view, running


def _blocked(
    est_s: float = 1800.0, waited_s: float = 2.5 * H, prio: int = 3, ckpt: bool = True
) -> PendingJob:
    spec = JobSpec(
        id="s", gpus=8, gpu_mem_gb=4.0, cpus=64.0, est_runtime_s=est_s, priority=prio,
        checkpointable=ckpt,
    )  # fmt: skip
    return PendingJob(spec, NOW - waited_s)


def _long(jid: str = "L", gpus: int = 8, prio: int = 1, ckpt: bool = True) -> JobSpec:
    return JobSpec(
        id=jid, gpus=gpus, gpu_mem_gb=4.0, host_mem_gb=1.0, cpus=1.0, priority=prio,
        checkpointable=ckpt, est_runtime_s=30 * H,
    )  # fmt: skip


def _plan(view, running, pj, facts=None, most=4, cfg=CFG):  # type: ignore[no-untyped-def]
    by: dict[int, list[RunningJob]] = {}
    for r in running:
        by.setdefault(r.node_index, []).append(r)
    facts = facts if facts is not None else {r.spec.id: P.MoveFacts(NOW - H) for r in running}
    soon = P.whole_free_within(view, running, NOW, -1.0)
    rem = pj.spec.est_runtime_s * (1.0 - pj.progress)  # every model as fast (``_speed``)
    plans = SW.short_plans([(pj, rem)], by, soon, view, facts, NOW, cfg, _speed(view), most)
    return plans[0] if plans else None


def test_it_fires_for_a_long_blocked_short_job_against_a_long_checkpointable_job() -> None:
    view, running = _setup([(_long(), NOW + 20 * H)])
    plan = _plan(view, running, _blocked())
    assert plan is not None and plan.for_job == "s" and plan.node == "n0"
    assert [v.job_id for v in plan.victims] == ["L"]
    assert dict(plan.rooms) == {"L": "n1"}  # it resumes at once, elsewhere
    assert plan.reason.startswith(SW.SHORT_RULE)
    # lost: 8 GPUs x (2 x 30 s save/restore + 0.1 x 1800 s at risk) = 1,920 GPU-s
    assert plan.victims[0].lost_gpu_s == 1920.0 and "loses 1920 GPU-s" in plan.reason


def test_never_a_protected_victim() -> None:
    view, running = _setup([(_long(), NOW + 20 * H)])
    moved = {"L": P.MoveFacts(NOW - H, last_moved_at=NOW - 600)}  # within min_interval_s
    assert _plan(view, running, _blocked(), facts=moved) is None
    fresh = {"L": P.MoveFacts(NOW - 60)}  # within min_run_s
    assert _plan(view, running, _blocked(), facts=fresh) is None
    view, running = _setup([(_long(ckpt=False), NOW + 20 * H)])  # would lose its work
    assert _plan(view, running, _blocked()) is None
    inf = msgspec.structs.replace(_long(), kind="inference")
    view, running = _setup([(inf, NOW + 20 * H)])
    assert _plan(view, running, _blocked()) is None


def test_never_a_victim_more_important_than_the_blocked_job() -> None:
    view, running = _setup([(_long(prio=5), NOW + 20 * H)])
    assert _plan(view, running, _blocked(prio=3)) is None
    assert _plan(view, running, _blocked(prio=5)) is not None


def test_not_when_the_victim_is_nearly_done() -> None:
    view, running = _setup([(_long(), NOW + 0.9 * H)])  # under short_max_s left
    assert _plan(view, running, _blocked()) is None
    # over short_max_s but under short_victim_factor (4) x the blocked job's 0.5 h
    view, running = _setup([(_long(), NOW + 1.5 * H)])
    assert _plan(view, running, _blocked()) is None
    view, running = _setup([(_long(), NOW + 2.5 * H)])
    assert _plan(view, running, _blocked()) is not None


def test_not_when_the_lost_work_outweighs_the_delay_saved() -> None:
    # the budget is 8 GPUs x min(its wait, time to the victim's end): 8 x 180 s < 1,920 GPU-s
    # (the plan alone; the wait bound, ``eligible_rows``, would not ask yet either)
    view, running = _setup([(_long(), NOW + 20 * H)])
    short_wait = _blocked(est_s=60.0, waited_s=180.0)
    assert _plan(view, running, short_wait) is None


def _renamed(pj: PendingJob, jid: str, **changes: object) -> PendingJob:
    return dataclasses.replace(pj, spec=msgspec.structs.replace(pj.spec, id=jid, **changes))


def test_the_queue_rows_it_acts_for() -> None:
    """Short (<= short_max_s left on the fastest model) and waited the bound: max(min_wait_s,
    short_wait_factor x remaining). A long job, or one before its bound, is not looked at;
    nor a service's replica."""
    jobs = [
        _blocked(est_s=1800.0, waited_s=3700.0),  # 2 x 1800 = 3600 <= 3700: yes
        _blocked(est_s=1800.0, waited_s=3000.0),  # before its bound
        _blocked(est_s=3 * H, waited_s=50 * H),  # long: never, however long it waited
        _blocked(est_s=60.0, waited_s=500.0),  # 2 x 60 s but under min_wait_s (600 s)
        _blocked(est_s=60.0, waited_s=700.0),  # yes
    ]
    jobs = [_renamed(j, f"j{k}") for k, j in enumerate(jobs)]
    svc = _renamed(jobs[0], "svc", kind="inference")
    q = PendingQueue([*jobs, svc])
    rows, rem = SW.eligible_rows(q.table(), NOW, np.ones(len(WORKLOAD_CLASSES)), CFG.preempt)
    assert rows.tolist() == [0, 4] and rem.tolist() == [1800.0, 60.0]
    # a faster model present halves the remaining runtime: the long one is still long
    rows, rem = SW.eligible_rows(q.table(), NOW, np.full(len(WORKLOAD_CLASSES), 2.0), CFG.preempt)
    assert rows.tolist() == [0, 1, 4] and rem.tolist() == [900.0, 900.0, 30.0]


def test_never_more_moves_than_allowed() -> None:
    """Eight 1-GPU long jobs fill n0; the 8-GPU short job needs them all: at most ``most``."""
    view, running = _setup([(_long(f"L{k}", gpus=1), NOW + 20 * H) for k in range(8)])
    assert _plan(view, running, _blocked(), most=4) is None
    assert _plan(view, running, _blocked(), most=0) is None
    plan = _plan(view, running, _blocked(), most=8)
    assert plan is not None and len(plan.victims) == 8


def test_the_switch_turns_it_off() -> None:
    view, running = _setup([(_long(), NOW + 20 * H)])
    off = dataclasses.replace(CFG, preempt=PreemptConfig(short_enabled=False))
    assert _plan(view, running, _blocked(), cfg=off) is None


PLAN_ARGS = (cluster(), st.integers(0, 3), st.sampled_from([300.0, 1200.0]), st.integers(1, 4))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(*PLAN_ARGS)
def test_a_plan_never_stops_a_protected_or_short_job(c, less, est_s, most) -> None:  # type: ignore[no-untyped-def]
    view, running, facts = c
    gpus = max(1, int(view.gpu_total.max()) - less)  # wide: it rarely fits without a move
    now = 10_000.0  # the strategy's clock: ends at now - 1, now + 600, now + 5,000
    by: dict[int, list[RunningJob]] = {}
    for r in running:
        if r.spec.kind != "inference" and (r.spec.checkpointable or r.spec.elastic is not None):
            by.setdefault(r.node_index, []).append(r)
    spec = JobSpec(
        id="s", gpus=gpus, gpu_mem_gb=4.0, est_runtime_s=est_s, priority=9, checkpointable=True
    )  # a swap needs a short job its lease's end can stop (stages.lease)
    pj = PendingJob(spec, now - 3 * H)
    cfg = dataclasses.replace(CFG, preempt=PreemptConfig(min_run_s=0.0))
    soon = P.whole_free_within(view, running, now, -1.0)
    plans = SW.short_plans([(pj, est_s)], by, soon, view, facts, now, cfg, _speed(view), most)
    plan = plans[0] if plans else None
    PLANS.append(plan is not None)
    if plan is None:
        return
    jobs = {r.spec.id: r for r in running}
    assert len(plan.victims) <= most
    for v in plan.victims:
        r = jobs[v.job_id]
        assert P.protection(r, facts[r.spec.id], now, cfg.preempt) == ""
        assert r.expected_end - now >= max(cfg.preempt.short_max_s, 4 * est_s)
        assert view.node_ids[r.node_index] == plan.node
        assert r.spec.kind != "inference" and (r.spec.checkpointable or r.spec.elastic)


def test_the_random_clusters_do_make_short_wait_plans() -> None:
    """The property above is not vacuous: some of its examples found a plan. Counted on
    hypothesis's fixed examples (``derandomized``), so the count is the same every run."""
    PLANS.clear()
    derandomized(test_a_plan_never_stops_a_protected_or_short_job, PLAN_ARGS, 300)()
    assert sum(PLANS) >= 5, f"{sum(PLANS)} plans in {len(PLANS)} examples"


def test_on_a_full_cluster_the_victim_resumes_after_the_short_job_within_the_bound() -> None:
    """No room elsewhere: the victim waits on its own node for the short job (20 min + a save
    and a restore <= the 30 min resume bound), the node held for it; a short job of 30 min
    would break the bound, and eight victims waiting 21 min each cost more than it gains."""
    view, running = _setup([(_long(), NOW + 20 * H)], n1_full=True)
    plan = _plan(view, running, _blocked(est_s=1200.0))
    assert plan is not None and dict(plan.rooms) == {"L": "n0"}
    assert "resume there after it, in about 1260 s" in plan.reason
    pc = CFG.preempt
    assert plan.lease_until_s == NOW + pc.resume_bound_s - pc.checkpoint_cost_s - pc.interval_s
    assert _plan(view, running, _blocked(est_s=1200.0, ckpt=False)) is None  # no lease: no swap
    assert _plan(view, running, _blocked(est_s=1800.0)) is None
    many = [(_long(f"L{k}", gpus=1), NOW + 20 * H) for k in range(8)]
    view, running = _setup(many, n1_full=True)
    assert _plan(view, running, _blocked(est_s=1200.0), most=8) is None  # 8 x 1260 s > 2.5 h


# ----- several plans per look, and the rule's own wake-up ---------------------------------
def _view_of(free_nodes: int) -> tuple[ClusterView, list[RunningJob]]:
    """n0, n1 (8 GPUs, 64 CPUs) each held by a long 8-GPU job (L0, L1); ``free_nodes`` more
    (f0, ...: 8 GPUs free, 16 CPUs) where victims may resume but a blocked job may not start."""
    ns = [node_spec(f"n{k}", gpus=8) for k in range(2)]
    ns += [node_spec(f"f{k}", gpus=8, cpus=16) for k in range(free_nodes)]
    view = ClusterView.build(ns)
    running = []
    for k in range(2):
        a = _alloc(_long(f"L{k}"), f"n{k}", tuple(range(8)))
        view.allocate(a)
        running.append(RunningJob.from_allocation(a, k, NOW + 20 * H))
    return view, running


def _plans(view, running, blocked, most=4, misses=4):  # type: ignore[no-untyped-def]
    by: dict[int, list[RunningJob]] = {}
    for r in running:
        by.setdefault(r.node_index, []).append(r)
    facts = {r.spec.id: P.MoveFacts(NOW - H) for r in running}
    soon = P.whole_free_within(view, running, NOW, -1.0)
    pairs = [(pj, pj.spec.est_runtime_s) for pj in blocked]
    return SW.short_plans(pairs, by, soon, view, facts, NOW, CFG, _speed(view), most, misses)


def test_several_plans_in_one_look_each_on_its_own_node_and_room() -> None:
    view, running = _view_of(free_nodes=2)
    two = [_renamed(_blocked(), "s0"), _renamed(_blocked(), "s1")]
    plans = _plans(view, running, two)
    assert [p.for_job for p in plans] == ["s0", "s1"]
    assert {p.node for p in plans} == {"n0", "n1"}
    rooms = [dict(p.rooms) for p in plans]
    assert {r[p.victims[0].job_id] for r, p in zip(rooms, plans, strict=True)} == {"f0", "f1"}
    assert len(_plans(view, running, two, most=1)) == 1  # max_per_pass over all the plans


def test_a_room_one_plan_promised_is_not_promised_again() -> None:
    """One free node: the first plan's victim resumes there; the second has no room elsewhere
    and a 30-min short job cannot swap within the bound (30 min + a save and a restore)."""
    view, running = _view_of(free_nodes=1)
    plans = _plans(view, running, [_renamed(_blocked(), "s0"), _renamed(_blocked(), "s1")])
    assert len(plans) == 1 and dict(plans[0].rooms) == {plans[0].victims[0].job_id: "f0"}


def test_a_look_stops_after_misses_in_a_row() -> None:
    view, running = _view_of(free_nodes=2)
    hopeless = [_renamed(_blocked(prio=0), f"h{k}") for k in range(4)]  # the victims rank 1
    jobs = [*hopeless, _renamed(_blocked(), "s")]
    assert _plans(view, running, jobs, misses=4) == []
    assert [p.for_job for p in _plans(view, running, jobs, misses=5)] == ["s"]


@st.composite
def long_jobs_cluster(draw):  # type: ignore[no-untyped-def]
    """2-6 nodes of 4 or 8 GPUs filled with random 1-4 GPU jobs (checkpointable, elastic,
    plain or inference; short or long; moved recently or not), some GPUs left free."""
    ns = [
        node_spec(f"n{k}", gpus=draw(st.sampled_from([4, 8])), cpus=draw(st.sampled_from([16, 64])))
        for k in range(draw(st.integers(2, 6)))
    ]
    view = ClusterView.build(ns)
    running: list[RunningJob] = []
    facts: dict[str, P.MoveFacts] = {}
    for k in range(draw(st.integers(4, 40))):
        i = draw(st.integers(0, len(ns) - 1))
        free = [g for g in range(ns[i].gpu_count) if view.gpu_free[i, g] >= 1.0]
        if not free:
            continue
        g = draw(st.integers(1, min(4, len(free))))
        kind = draw(st.sampled_from(["ckpt", "ckpt", "elastic", "plain", "inference"]))
        spec = JobSpec(
            id=f"r{k}", gpus=g, gpu_mem_gb=4.0, host_mem_gb=1.0, cpus=1.0,
            priority=draw(st.integers(0, 9)), checkpointable=kind in ("ckpt", "inference"),
            elastic=Elastic(min_gpus=1, max_gpus=g) if kind == "elastic" else None,
            kind="inference" if kind == "inference" else "training",
        )  # fmt: skip
        alloc = _alloc(spec, ns[i].id, tuple(free[:g]))
        view.allocate(alloc)
        end = NOW + draw(st.sampled_from([600.0, 5 * H, 30 * H]))
        running.append(RunningJob.from_allocation(alloc, i, end))
        moved = draw(st.sampled_from([None, None, NOW - 60, NOW - 2 * H]))
        facts[spec.id] = P.MoveFacts(
            started_at=NOW - draw(st.sampled_from([60.0, H])), last_moved_at=moved
        )
    return view, running, facts


LOOK_ARGS = (
    long_jobs_cluster(),
    st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=5),
    st.integers(1, 6),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(*LOOK_ARGS)
def test_plans_of_one_look_never_share_a_node_or_a_victim_nor_over_allocate(c, sizes, most) -> None:  # type: ignore[no-untyped-def]
    view, running, facts = c
    now = NOW
    by: dict[int, list[RunningJob]] = {}
    for r in running:
        if r.spec.kind != "inference" and (r.spec.checkpointable or r.spec.elastic is not None):
            by.setdefault(r.node_index, []).append(r)
    top = int(view.gpu_total.max())
    blocked: list[tuple[PendingJob, float]] = []
    for k, g in enumerate(sizes):
        spec = JobSpec(
            id=f"s{k}", gpus=min(g, top), gpu_mem_gb=4.0, est_runtime_s=300.0, priority=9,
            checkpointable=True,  # a swap needs a short job its lease's end can stop
        )  # fmt: skip
        blocked.append((PendingJob(spec, now - 3 * H), 300.0))
    cfg = dataclasses.replace(CFG, preempt=PreemptConfig(min_run_s=0.0))
    soon = P.whole_free_within(view, running, now, -1.0)
    plans = SW.short_plans(blocked, by, soon, view, facts, now, cfg, _speed(view), most)
    LOOKS.append(len(plans))
    jobs = {r.spec.id: r for r in running}
    specs = {pj.spec.id: pj.spec for pj, _ in blocked}
    assert sum(len(p.victims) for p in plans) <= most
    nodes = [p.node for p in plans]
    victims = [v.job_id for p in plans for v in p.victims]
    assert len(set(nodes)) == len(nodes) and len(set(victims)) == len(victims)
    claimed = np.zeros(len(view.node_ids))  # whole GPUs promised to victims resuming elsewhere
    room_nodes: list[set[str]] = []
    for p in plans:
        released = [(jobs[v.job_id], v.shrink_to) for v in p.victims]
        assert P.fits_after_release(specs[p.for_job], view, view.index[p.node], released)
        for v in p.victims:
            r = jobs[v.job_id]
            assert P.protection(r, facts[r.spec.id], now, cfg.preempt) == ""
            assert view.node_ids[r.node_index] == p.node
        elsewhere = {n for _, n in p.rooms if n != p.node}
        room_nodes.append(elsewhere)
        for j, n in p.rooms:
            if n != p.node:
                claimed[view.index[n]] += len(jobs[j].gpu_indices)
    assert (claimed <= soon + 1e-9).all()  # never more than is free where they resume
    for a, ra in enumerate(room_nodes):  # a node is one plan's, as its node or its rooms'
        for b, rb in enumerate(room_nodes):
            assert a == b or (not (ra & rb) and plans[b].node not in ra)


def test_the_random_clusters_do_make_several_plans_in_one_look() -> None:
    """The property above is not vacuous: some looks found two plans or more (counted on
    hypothesis's fixed examples, as the single-plan count above)."""
    LOOKS.clear()
    derandomized(
        test_plans_of_one_look_never_share_a_node_or_a_victim_nor_over_allocate, LOOK_ARGS, 200
    )()
    assert sum(n >= 2 for n in LOOKS) >= 3, f"plans per look: {Counter(LOOKS)}"


def _queue(*jobs: PendingJob) -> np.ndarray:
    return PendingQueue(list(jobs)).table()


def test_the_rule_wakes_when_the_next_short_job_reaches_its_bound() -> None:
    """A 30-min job queued at NOW reaches its bound (2 x 30 min) at NOW + 1 h: the wake-up;
    not before the rule may look again, and a job already looked at is not owed one."""
    best, pc = np.ones(len(WORKLOAD_CLASSES)), CFG.preempt
    t = _queue(_renamed(_blocked(waited_s=0.0), "a"), _renamed(_blocked(est_s=3 * H), "long"))
    assert SW.next_due_s(t, NOW, best, pc, looked_s=-np.inf, due_s=-np.inf) == NOW + H
    assert SW.next_due_s(t, NOW, best, pc, -np.inf, due_s=NOW + 2 * H) == NOW + 2 * H
    assert SW.next_due_s(t, NOW + 2 * H, best, pc, looked_s=NOW + 2 * H, due_s=0.0) is None
    # owed since NOW + 1 h, but the rule could not look at NOW + 1.5 h: one interval later
    later = SW.next_due_s(t, NOW + 1.5 * H, best, pc, looked_s=NOW, due_s=NOW)
    assert later == NOW + 1.5 * H + pc.interval_s
    assert SW.next_due_s(_queue(), NOW, best, pc, -np.inf, -np.inf) is None


def test_a_full_quiet_cluster_is_woken_for_a_short_job_and_serves_it() -> None:
    """The scheduler asks for the instant itself (``next_move_s``, which both drivers honour)
    and its tick then orders the move, with no event in between."""
    from libs.policy.core import Scheduler
    from libs.policy.profiles import ProfileTable
    from libs.policy.scores import ModelTables

    ns = [node_spec("n0", gpus=8), node_spec("f0", gpus=8, cpus=16)]
    cfg = dataclasses.replace(CFG, power_saving=False)
    s = Scheduler(ns, cfg=cfg, profiles=ProfileTable.default(), now=0.0)
    s.queue_job(PendingJob(msgspec.structs.replace(_long(), cpus=32.0), 0.0))
    for p in s.tick(0.0).places:
        s.start_job(p.allocation.job_id, p.allocation, p.job.spec, 0.0)
    assert len(s.running) == 1
    short = _blocked(est_s=1200.0).spec
    s.queue_job(PendingJob(short, H))
    d = s.tick(H, woke=True)
    assert not d.places and not d.moves  # full; and it has not waited yet
    best = ModelTables.build(s.view, s.profiles).speed.max(axis=0)
    rem_s = 1200.0 / float(best[CLASS_INDEX[short.workload_class]])
    due = H + max(600.0, 2.0 * rem_s)
    assert s.next_move_s(H) == pytest.approx(due)
    assert d.next_tick_s is not None and d.next_tick_s <= due + 1e-6
    moves = s.tick(s.next_move_s(H), woke=False).moves
    assert [m.job_id for m in moves] == ["L"] and moves[0].reason.startswith(SW.SHORT_RULE)


def test_a_deadline_job_is_acted_for_before_its_deadline_is_lost() -> None:
    """A 30-min job whose deadline leaves 1.5 x its runtime must start within 15 min, long
    before its wait bound (1 h): it is eligible from 90 s (a look and a save) before that
    latest start until it, then only at its bound; the wake-up is the window's opening."""
    best, pc = np.ones(len(WORKLOAD_CLASSES)), CFG.preempt
    pj = _renamed(_blocked(waited_s=0.0), "d", deadline=NOW + 2700.0)
    t = _queue(pj)
    opens = NOW + 900.0 - SW.deadline_margin_s(pc)
    assert SW.deadline_margin_s(pc) == 90.0

    def rows(at: float) -> list[int]:
        return SW.eligible_rows(t, at, best, pc)[0].tolist()

    assert rows(opens - 1) == [] and rows(opens) == [0] and rows(NOW + 900.0) == [0]
    assert rows(NOW + 901.0) == [] and rows(NOW + H) == [0]
    assert SW.next_due_s(t, NOW, best, pc, -np.inf, -np.inf) == opens
    assert SW.next_due_s(t, opens, best, pc, looked_s=opens, due_s=opens + 60) == NOW + H


_OPS = ["add", "add", "add", "replace", "remove", "remove", "look", "look", "ask", "best", "back"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(_OPS),
            st.floats(0.0, 3 * H),  # an enqueue time, a runtime or a step of the clock
            st.integers(0, 1_000),  # which row, which class, which speed
            st.sampled_from(["none", "deadline", "deadline", "inference"]),
        ),
        max_size=40,
    )
)
def test_the_kept_wake_up_and_rows_equal_the_definitions(ops) -> None:  # type: ignore[no-untyped-def]
    """``fast.short_due.ShortDue`` against ``next_due_s`` and ``eligible_rows`` at every step
    of a random run: jobs join (short and long, with and without a deadline, inference), are
    replaced in their row and leave (the last row swaps in); the rule looks (``looked_s`` and
    ``due_s`` move on) or is owed a look it cannot take (``now`` passes ``due_s``); the fastest
    speeds change; ``looked_s`` even goes back (never in a run: the memo starts over)."""
    from libs.policy.fast.short_due import ShortDue

    q, kept, pc = PendingQueue(), ShortDue(), CFG.preempt
    best = np.full(len(WORKLOAD_CLASSES), 1.5)
    now, looked, due, k = NOW, -np.inf, -np.inf, 0

    def job(jid: str, x: int, y: float, what: str) -> PendingJob:
        est = 60.0 + (x % 60) * 70.0  # short and long (its remaining depends on ``best``)
        slack = (0.5, 1.0, 1.2, 2.0, 4.0)[x // 60 % 5]  # an empty window, a closing, an open one
        pj = _renamed(_blocked(est_s=est, waited_s=y), jid)
        return _renamed(
            pj, jid, workload_class=WORKLOAD_CLASSES[x % len(WORKLOAD_CLASSES)],
            deadline=now - y + slack * est / 1.5 if what == "deadline" else None,
            kind="inference" if what == "inference" else "training",
        )  # fmt: skip

    for op, y, x, what in ops:
        if op == "add":
            k += 1
            q.add(job(f"j{k}", x, y, what))
        elif op == "replace" and len(q):
            q.add(job(q.jobs()[x % len(q)].spec.id, x + 7, y / 3, what))  # later, mostly
        elif op == "remove" and len(q):
            q.remove(q.jobs()[x % len(q)].spec.id)
        elif op == "look":
            looked, due = now, now + pc.interval_s
        elif op == "best":
            best = best.copy()
            best[x % len(best)] = 0.5 + (x % 7) / 2
        elif op == "back":
            looked = looked - y
        now += y / 10 if x % 4 else y  # sometimes past ``due_s`` and bounds at once
        want = SW.next_due_s(q.table(), now, best, pc, looked, due)
        want_rows, want_rem = SW.eligible_rows(q.table(), now, best, pc)
        for ask in ("wake", "rows") if x % 2 else ("rows", "wake"):  # either first
            if ask == "wake":
                assert kept.next_s(q, now, best, pc, looked, due) == want
            else:
                rows, rem = kept.eligible(q, now, best, pc)
                assert rows.tolist() == want_rows.tolist() and rem.tolist() == want_rem.tolist()


def test_the_kept_wake_up_keeps_its_answers_between_changes() -> None:
    """The heap answers without the definition while the rule is not owed a look it missed:
    a thousand queued jobs, asked at many instants with one job joining or leaving at each,
    equal to the definition every time (and the dead entries of jobs that left are dropped)."""
    from libs.policy.fast.short_due import ShortDue

    q, kept, pc = PendingQueue(), ShortDue(), CFG.preempt
    best = np.full(len(WORKLOAD_CLASSES), 1.5)
    rng = np.random.default_rng(7)
    now, looked, due = NOW, -np.inf, -np.inf
    for k in range(3000):
        pj = _blocked(est_s=float(rng.uniform(60.0, 2 * H)), waited_s=float(rng.uniform(0, H)))
        q.add(_renamed(pj, f"j{k}"))
        if len(q) > 1000:
            q.remove(q.jobs()[int(rng.integers(len(q)))].spec.id)
        now += float(rng.uniform(0.0, 20.0))
        if k % 7 == 0:
            looked, due = now, now + pc.interval_s
        want = SW.next_due_s(q.table(), now, best, pc, looked, due)
        assert kept.next_s(q, now, best, pc, looked, due) == want
    assert len(kept._heap) <= 4 * len(q) + 1024


def test_the_kept_wake_up_forgets_a_replaced_row_and_an_empty_window() -> None:
    """Two cases a random run rarely hits: a job replaced in its row (its old wait bound is
    no longer owed) and a deadline already out of reach (an empty window owes nothing: the
    wait bound is the wake-up, not the enqueue)."""
    from libs.policy.fast.short_due import ShortDue

    q, kept, pc = PendingQueue(), ShortDue(), CFG.preempt
    best = np.ones(len(WORKLOAD_CLASSES))
    looked, due = NOW, NOW + pc.interval_s
    q.add(_renamed(_blocked(est_s=1800.0, waited_s=0.0), "a"))  # bound at NOW + 1 h
    assert kept.next_s(q, NOW + 1, best, pc, looked, due) == NOW + H
    q.add(_renamed(_blocked(est_s=1800.0, waited_s=-H), "a"))  # replaced: queued 1 h later
    assert kept.next_s(q, NOW + 2, best, pc, looked, due) == NOW + 2 * H
    late = _renamed(_blocked(est_s=1800.0, waited_s=-10.0), "late", deadline=NOW + 110.0)
    q.add(late)  # its latest start (NOW + 110 - 1800) is before it was queued
    for q_now in (NOW + 20, NOW + 30):
        want = SW.next_due_s(q.table(), q_now, best, pc, looked, due)
        assert want == NOW + 10 + H and kept.next_s(q, q_now, best, pc, looked, due) == want


def test_the_kept_fastest_speeds_follow_the_tables() -> None:
    """``ShortDue.fastest`` is ``speed.max(axis=0)`` of the tables it is given, kept for the
    same tables object only."""
    from libs.policy.fast.short_due import ShortDue
    from libs.policy.scores import ModelTables

    kept = ShortDue()
    a = ModelTables(np.array([[1.0, 2.0], [3.0, 1.0]]), np.ones((2, 2)))
    b = ModelTables(np.array([[5.0, 1.0]]), np.ones((1, 2)))
    assert kept.fastest(a).tolist() == [3.0, 2.0] and kept.fastest(a) is kept.fastest(a)
    assert kept.fastest(b).tolist() == [5.0, 1.0] and kept.fastest(a).tolist() == [3.0, 2.0]
