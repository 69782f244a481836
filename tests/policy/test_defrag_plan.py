"""The defragmenter's plan (``stages.defrag.plan_moves``): hand-worked clusters where the right
moves are known, and properties on random ones: a plan never moves a job ``movable`` refuses,
never over-allocates a destination (all its moves together), and after it the blocked job fits.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.stages.defrag import Move, allocation_of, fits, lost_work_s, plan_moves
from libs.policy.types import PendingJob, RunningJob
from proto.jobs import JobSpec
from tests.policy.strategies import node_spec

CFG = PolicyConfig.default()


def job(jid: str, gpus: float, priority: int = 3, **kw) -> JobSpec:
    kw = {"gpu_mem_gb": 4.0, "host_mem_gb": 4.0, "cpus": 1.0} | kw
    return JobSpec(id=jid, gpus=gpus, priority=priority, **kw)


def cluster(nodes, placed):
    """A view with ``placed`` = [(spec, node index, gpu slots, share)] and their RunningJobs."""
    view = ClusterView.build(nodes)
    running = []
    for spec, n, gpus, share in placed:
        r = RunningJob(spec, n, tuple(gpus), share, expected_end=10_000.0)
        view.allocate(allocation_of(r, view))
        running.append(r)
    return view, running


def apply(view: ClusterView, running, moves: list[Move]) -> ClusterView:
    """The view after the moves (on a copy); ``allocate`` raises on any over-allocated GPU."""
    v = view.copy()
    by_id = {r.spec.id: r for r in running}
    for m in moves:
        r = by_id[m.job_id]
        assert v.node_ids[r.node_index] == m.node_from
        v.release(allocation_of(r, v))
    for m in moves:
        r = by_id[m.job_id]
        dest = RunningJob(r.spec, v.index[m.node_to], m.gpu_indices_to, r.gpu_share, 0.0)
        v.allocate(allocation_of(dest, v))
    return v


def plan(view, running, blocked, movable=lambda r: True, max_moves=8):
    pend = [PendingJob(b, enqueued_at=0.0) for b in blocked]
    return plan_moves(view, running, pend, now=100.0, cfg=CFG, movable=movable,
                      max_moves=max_moves)  # fmt: skip


def two_split_nodes(prio0: int = 3, prio1: int = 3):
    """Two 4-GPU nodes, each with two 1-GPU jobs on GPUs 0 and 2: 4 GPUs free, none together."""
    nodes = [node_spec("n0", 4), node_spec("n1", 4)]
    placed = [
        (job("a", 1, prio0), 0, (0,), 1.0),
        (job("b", 1, prio0), 0, (2,), 1.0),
        (job("c", 1, prio1), 1, (0,), 1.0),
        (job("d", 1, prio1), 1, (2,), 1.0),
    ]
    return cluster(nodes, placed)


def test_a_four_gpu_job_gets_a_node_cleared_by_two_moves():
    view, running = two_split_nodes()
    big = job("big", 4)
    assert not fits(big, view, CFG).any()
    moves = plan(view, running, [big])
    assert len(moves) == 2 and {m.for_job for m in moves} == {"big"}
    (src,) = {m.node_from for m in moves}
    (dst,) = {m.node_to for m in moves}
    assert src != dst
    assert sorted(g for m in moves for g in m.gpu_indices_to) == [1, 3]  # the other's free GPUs
    after = apply(view, running, moves)
    assert fits(big, after, CFG)[view.index[src]]


def test_the_view_is_not_modified():
    view, running = two_split_nodes()
    before = (view.gpu_free.copy(), view.cpus_free.copy(), view.gen)
    plan(view, running, [job("big", 4)])
    assert np.array_equal(view.gpu_free, before[0]) and view.gen == before[2]
    assert np.array_equal(view.cpus_free, before[1])


def test_lowest_priority_jobs_move():
    view, running = two_split_nodes(prio0=8, prio1=1)
    moves = plan(view, running, [job("big", 4)])
    assert {m.job_id for m in moves} == {"c", "d"}
    view, running = two_split_nodes(prio0=1, prio1=8)
    assert {m.job_id for m in plan(view, running, [job("big", 4)])} == {"a", "b"}


def test_a_refused_job_never_moves_and_no_plan_without_movable_jobs():
    view, running = two_split_nodes()
    moves = plan(view, running, [job("big", 4)], movable=lambda r: r.spec.id in ("c", "d"))
    assert {m.job_id for m in moves} == {"c", "d"}
    assert plan(view, running, [job("big", 4)], movable=lambda r: r.spec.id in ("a", "c")) == []
    assert plan(view, running, [job("big", 4)], max_moves=1) == []


def test_a_job_that_fits_needs_no_move_and_too_little_free_gets_none():
    view, running = two_split_nodes()
    assert plan(view, running, [job("two", 2)]) == []  # GPUs 1 and 3 are free on each node
    assert plan(view, running, [job("huge", 4), job("huge2", 4)]) != []
    view, running = cluster([node_spec("n0", 2)], [(job("a", 1), 0, (0,), 1.0)])
    assert plan(view, running, [job("two", 2)]) == []  # 1 GPU free in all: nothing helps


def three_busy_gpus(label: str = ""):
    """n0: 4 GPUs, jobs p, q, r on GPUs 1, 2, 3; n1: 4 GPUs, three fixed jobs, GPU 3 free."""
    labels = {"nvlink_pairs": label} if label else {}
    n0 = replace_labels(node_spec("n0", 4), labels)
    placed = [(job(x, 1), 0, (g,), 1.0) for x, g in (("p", 1), ("q", 2), ("r", 3))]
    placed += [(job(f"fixed{g}", 1), 1, (g,), 1.0) for g in range(3)]
    return cluster([n0, node_spec("n1", 4)], placed)


def replace_labels(spec, labels):
    import msgspec

    return msgspec.structs.replace(spec, labels=labels)


def fixed_stay(r: RunningJob) -> bool:
    return not r.spec.id.startswith("fixed")


def test_a_two_gpu_job_gets_an_nvlink_pair_freed():
    view, running = three_busy_gpus()
    (m,) = plan(view, running, [job("pair", 2)], movable=fixed_stay)
    assert (m.job_id, m.node_to, m.gpu_indices_to) == ("p", "n1", (3,))  # frees pair (0, 1)
    view, running = three_busy_gpus("0-3,1-2")  # the node's own topology: pairs (0,3), (1,2)
    (m,) = plan(view, running, [job("pair", 2)], movable=fixed_stay)
    assert m.job_id == "r"  # frees pair (0, 3)


def test_fractions_pack_to_make_room_for_a_half():
    nodes = [node_spec("n0", 1), node_spec("n1", 1)]
    placed = [
        (job("a", 0.3), 0, (0,), 0.3),
        (job("b", 0.4), 0, (0,), 0.4),
        (job("c", 0.7), 1, (0,), 0.7),
    ]
    view, running = cluster(nodes, placed)
    half = job("half", 0.5)
    assert not fits(half, view, CFG).any()
    (m,) = plan(view, running, [half])
    assert (m.job_id, m.node_from, m.node_to, m.gpu_indices_to) == ("a", "n0", "n1", (0,))
    assert fits(half, apply(view, running, [m]), CFG)[0]


def test_a_cpu_only_job_leaves_so_a_moved_half_has_cpus():
    # a: 1 GPU, a movable half x; b: 1 GPU with a fixed half y and a movable CPU-only c holding
    # all b's other CPUs; c3: a full GPU but 64 CPUs. A whole-GPU job fits on a once x moves to
    # b, which has the GPU share but no CPUs until c moves to c3.
    nodes = [node_spec("a", 1, cpus=8), node_spec("b", 1, cpus=8), node_spec("c3", 1, cpus=64)]
    placed = [
        (job("x", 0.5, cpus=2.0), 0, (0,), 0.5),
        (job("y", 0.5, cpus=1.0), 1, (0,), 0.5),
        (job("c", 0.0, cpus=7.0), 1, (), 1.0),
        (job("z", 1.0, cpus=1.0), 2, (0,), 1.0),
    ]
    view, running = cluster(nodes, placed)
    whole = job("whole", 1.0, cpus=2.0)
    moves = plan(view, running, [whole], movable=lambda r: r.spec.id in ("x", "c"))
    assert [(m.job_id, m.node_from, m.node_to) for m in moves] == [
        ("c", "b", "c3"),
        ("x", "a", "b"),
    ]
    assert moves[0].gpu_indices_to == ()
    assert fits(whole, apply(view, running, moves), CFG)[0]


def test_lost_work_is_time_since_checkpoint_or_start():
    cfg = replace(CFG, defrag=replace(CFG.defrag, checkpoint_interval_s=1000.0))
    r = RunningJob(job("x", 1, est_runtime_s=5000.0), 0, (0,), 1.0, expected_end=6000.0)
    assert lost_work_s(r, 3500.0, cfg) == 2500.0  # started at 1000, never saves
    rc = RunningJob(job("y", 1, est_runtime_s=5000.0, checkpointable=True), 0, (0,), 1.0, 6000.0)
    assert lost_work_s(rc, 3500.0, cfg) == 500.0  # saved at 3000


# ---- properties on random clusters -------------------------------------------------------
SHAPES = (0.25, 0.5, 1.0, 1.0, 2.0, 4.0)


@st.composite
def scenes(draw):
    """Random nodes filled by random jobs (first fit), a random blocked job and movable set."""
    n = draw(st.integers(2, 5))
    nodes = [node_spec(f"n{i}", draw(st.sampled_from([2, 4, 8])), cpus=32, host=128.0)
             for i in range(n)]  # fmt: skip
    view = ClusterView.build(nodes)
    running = []
    for k in range(draw(st.integers(2, 4 * n))):
        g = draw(st.sampled_from(SHAPES))
        spec = job(f"j{k}", g, draw(st.integers(0, 9)), cpus=float(draw(st.sampled_from([1, 4]))))
        ok = np.flatnonzero(fits(spec, view, CFG))
        if len(ok) == 0:
            continue
        i = int(draw(st.sampled_from(ok.tolist())))
        free = view.gpu_free[i]
        # random slots among those that hold it: scattered jobs are what fragments a node
        ok_slots = np.flatnonzero((free >= min(g, 1.0) - EPS) & view.gpu_exists[i]).tolist()
        slots = tuple(sorted(draw(st.permutations(ok_slots))[: max(1, int(g))]))
        r = RunningJob(spec, i, slots, min(g, 1.0), expected_end=float(draw(st.integers(0, 9e3))))
        view.allocate(allocation_of(r, view))
        running.append(r)
    blocked = [job(f"b{k}", draw(st.sampled_from((0.5, 0.75, 2.0, 4.0, 8.0)))) for k in range(2)]
    ids = [r.spec.id for r in running] or ["-"]
    refused = draw(st.sets(st.sampled_from(ids), max_size=3))
    return view, running, blocked, refused


@settings(max_examples=300, deadline=None)
@given(scenes(), st.integers(1, 6))
def test_plans_respect_movable_capacity_and_make_room(scene, max_moves):
    view, running, blocked, refused = scene
    gen = view.gen
    moves = plan(view, running, blocked, movable=lambda r: r.spec.id not in refused,
                 max_moves=max_moves)  # fmt: skip
    assert view.gen == gen  # untouched
    assert len(moves) <= max_moves
    assert len({m.job_id for m in moves}) == len(moves)  # a job moves at most once
    assert not {m.job_id for m in moves} & refused
    assert all(m.node_from != m.node_to for m in moves)
    after = apply(view, running, moves)  # raises on an over-allocated GPU share
    assert (after.cpus_free >= -EPS).all() and (after.host_mem_free_gb >= -EPS).all()
    assert (after.gpu_mem_free_gb >= -EPS).all()
    for b in {m.for_job for m in moves}:
        spec = next(x for x in blocked if x.id == b)
        assert fits(spec, after, CFG).any(), f"{b} still does not fit after its moves"
