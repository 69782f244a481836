"""The defragmenter's compaction rule (``stages.compact``): fractions pack into holes so that a
GPU comes free for a blocked job. A hand-worked cluster where the per-node plan finds nothing,
and properties on random fractional clusters: a compaction never moves a protected job, never
over-allocates (all its moves together), and frees at least what it claims (the blocked job
fits on the node it names, with its share free on one GPU there)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.policy.cluster import EPS, ClusterView
from libs.policy.stages.compact import compaction, hole_for
from libs.policy.stages.defrag import fits
from libs.policy.stages.defrag_room import Work, allocation_of
from libs.policy.types import RunningJob
from tests.policy.strategies import node_spec
from tests.policy.test_defrag_plan import CFG, apply, cluster, job, plan


def test_two_fractions_pack_into_holes_and_a_whole_gpu_comes_free():
    # three 1-GPU nodes: a holds movable 0.3 + 0.2; b a fixed 0.7 (hole 0.3); c a fixed 0.8
    # (hole 0.2). A 1-GPU job fits once 0.3 joins b and 0.2 joins c; never onto a free GPU.
    nodes = [node_spec(n, 1) for n in ("a", "b", "c")]
    placed = [
        (job("m3", 0.3), 0, (0,), 0.3),
        (job("m2", 0.2), 0, (0,), 0.2),
        (job("f7", 0.7), 1, (0,), 0.7),
        (job("f8", 0.8), 2, (0,), 0.8),
    ]
    view, running = cluster(nodes, placed)
    whole = job("whole", 1.0)
    assert not fits(whole, view, CFG).any()
    moves = plan(view, running, [whole], movable=lambda r: r.spec.id.startswith("m"))
    assert sorted((m.job_id, m.node_to) for m in moves) == [("m2", "c"), ("m3", "b")]
    after = apply(view, running, moves)
    assert fits(whole, after, CFG)[0] and after.gpu_free[0, 0] == 1.0


def test_a_hole_is_never_a_whole_free_gpu():
    nodes = [node_spec("a", 1), node_spec("b", 1)]
    view, running = cluster(nodes, [(job("m", 0.5), 0, (0,), 0.5)])
    assert hole_for(running[0], view, CFG, 0) is None  # b is wholly free: no hole to fill
    assert plan(view, running, [job("w", 1.0)]) == []  # w fits on b: no move


# ---- properties on random fractional clusters --------------------------------------------
FRACTIONS = (0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7)


@st.composite
def scenes(draw):
    """Nodes of 1-4 GPUs filled with random fractions (random GPUs among those that hold
    them), a protected subset, and a blocked job asking a fraction or one whole GPU."""
    n = draw(st.integers(2, 6))
    nodes = [node_spec(f"n{i}", draw(st.integers(1, 4)), cpus=draw(st.sampled_from([4, 32])),
                       host=64.0) for i in range(n)]  # fmt: skip
    view = ClusterView.build(nodes)
    running = []
    for k in range(draw(st.integers(2, 6 * n))):
        g = draw(st.sampled_from(FRACTIONS))
        spec = job(f"j{k}", g, draw(st.integers(0, 9)), cpus=float(draw(st.sampled_from([1, 3]))))
        ok = np.flatnonzero(fits(spec, view, CFG))
        if len(ok) == 0:
            continue
        i = int(draw(st.sampled_from(ok.tolist())))
        slots = np.flatnonzero((view.gpu_free[i] >= g - EPS) & view.gpu_exists[i]).tolist()
        r = RunningJob(spec, i, (draw(st.sampled_from(slots)),), g, expected_end=1e4)
        view.allocate(allocation_of(r, view))
        running.append(r)
    ids = [r.spec.id for r in running] or ["-"]
    protected = draw(st.sets(st.sampled_from(ids), max_size=len(ids)))
    blocked = job("b", draw(st.sampled_from((0.5, 0.6, 0.75, 0.9, 1.0))), cpus=2.0)
    return view, running, protected, blocked


@settings(max_examples=200, deadline=None)
@given(scenes(), st.integers(1, 6))
def test_a_compaction_moves_no_protected_job_never_overallocates_and_frees_its_claim(scene, budget):
    view, running, protected, blocked = scene
    work = Work(view, running, CFG)
    got = compaction(work, blocked, now=0.0, cfg=CFG, budget=budget,
                     movable=lambda r: r.spec.id not in protected)  # fmt: skip
    assert np.allclose(work.view.gpu_free, view.gpu_free)  # left as it was found
    if got is None:
        return
    node, pairs = got
    assert 1 <= len(pairs) <= budget
    before = [b for b, _ in pairs]
    assert not {b.spec.id for b in before} & protected
    assert len({b.spec.id for b in before}) == len(before)  # a job moves once
    v = view.copy()
    for b, a in pairs:  # in order; allocate raises on any over-allocated GPU share
        assert a.node_index != node and b.node_index == node
        v.release(allocation_of(b, v))
        assert v.gpu_free[a.node_index, a.gpu_indices[0]] < 1.0 - EPS  # into a hole
        v.allocate(allocation_of(a, v))
    assert (v.cpus_free >= -EPS).all() and (v.host_mem_free_gb >= -EPS).all()
    share = min(blocked.gpus, 1.0)
    assert fits(blocked, v, CFG)[node]  # it fits where the compaction said
    assert (v.gpu_free[node] >= share - EPS).any()
    assert np.isclose(v.gpu_free.sum(), view.gpu_free.sum())  # moves, nothing lost or made
