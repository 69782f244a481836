"""Power saving decisions (libs.policy.power): never suspend a node that holds a job, is
reserved, or could host a blocked job; keep the warm reserve; resume for blocked jobs."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.placement import place, to_allocation
from libs.policy.power import plan
from libs.policy.profiles import ProfileTable
from proto.jobs import JobSpec
from proto.nodes import NodeSpec
from tests.policy.strategies import jobs, node_spec, nodes

CFG = dataclasses.replace(PolicyConfig.default(), warm_reserve_frac=0.0)


def _nodes(n: int, g: int = 4) -> list[NodeSpec]:
    return [node_spec(f"n{i}", g, host=256.0, cpus=64, idle_w=30.0) for i in range(n)]


def _plan(view, idle, suspended=None, resuming=None, blocked=(), reserved=(), cfg=CFG):
    n = len(view.node_ids)
    z = np.zeros(n, dtype=bool)
    return plan(
        view,
        idle_s=np.asarray(idle, dtype=float),
        suspended=z.copy() if suspended is None else np.asarray(suspended),
        resuming=z.copy() if resuming is None else np.asarray(resuming),
        blocked=list(blocked),
        reserved=reserved,
        cfg=cfg,
    )


def test_suspends_long_idle_empty_nodes_only():
    view = ClusterView.build(_nodes(3))
    spec = JobSpec(id="busy", gpus=1.0, gpu_mem_gb=8.0)
    res = place(spec, view, ProfileTable.default(), CFG)
    view.allocate(to_allocation(spec, res, 0.0))
    idle = [np.nan, np.nan, np.nan]
    idle[res.node_index] = 10_000.0  # a wrong idle figure must not suspend a busy node
    others = [i for i in range(3) if i != res.node_index]
    idle[others[0]] = CFG.suspend_after_s + 1
    idle[others[1]] = CFG.suspend_after_s - 1  # not idle long enough
    p = _plan(view, idle)
    assert p.suspend == (others[0],)
    assert p.resume == ()


def test_never_suspends_a_reserved_node_or_one_a_blocked_job_could_use():
    view = ClusterView.build(_nodes(2))
    idle = [1e6, 1e6]
    assert _plan(view, idle, reserved=(0,)).suspend == (1,)
    big = JobSpec(id="b", gpus=4.0, gpu_mem_gb=8.0)
    assert _plan(view, idle, blocked=[big]).suspend == ()


def test_keeps_a_warm_reserve_per_model():
    view = ClusterView.build(_nodes(4))
    cfg = dataclasses.replace(CFG, warm_reserve_frac=0.5)  # keep 8 of 16 GPUs free and awake
    p = _plan(view, [1e6] * 4, cfg=cfg)
    assert len(p.suspend) == 2


def test_resumes_for_blocked_jobs_one_node_per_need():
    view = ClusterView.build(_nodes(3))
    down = np.array([True, True, True])
    two = [JobSpec(id=f"j{i}", gpus=2.0, gpu_mem_gb=8.0) for i in range(2)]
    p = _plan(view, [1e6] * 3, suspended=down, blocked=two)
    assert len(p.resume) == 1  # both fit the GPUs of one booting node
    four = [JobSpec(id=f"k{i}", gpus=4.0, gpu_mem_gb=8.0) for i in range(2)]
    p = _plan(view, [1e6] * 3, suspended=down, blocked=four)
    assert len(p.resume) == 2
    # a job the suspended nodes cannot hold even together wakes nothing
    huge = JobSpec(id="h", gpus=16.0, gpu_mem_gb=8.0)
    assert _plan(view, [1e6] * 3, suspended=down, blocked=[huge]).resume == ()
    # a gang (8 GPUs on 4-GPU nodes) wakes the two nodes it needs (stages.gang.power_needs)
    gang = JobSpec(id="g", gpus=8.0, gpu_mem_gb=8.0)
    assert len(_plan(view, [1e6] * 3, suspended=down, blocked=[gang]).resume) == 2


def test_power_saving_off_decides_nothing():
    view = ClusterView.build(_nodes(2))
    cfg = dataclasses.replace(CFG, power_saving=False)
    p = _plan(view, [1e6, 1e6], suspended=np.array([True, False]), blocked=[], cfg=cfg)
    assert p.suspend == () and p.resume == ()


@settings(max_examples=40, deadline=None)
@given(nodes(), jobs(), st.data())
def test_plan_properties(ns, specs, data):
    """Random clusters: suspended nodes are always empty, awake, not reserved, never needed by a
    blocked job; resumed ones were suspended and can hold some blocked job."""
    view = ClusterView.build(ns)
    prof = ProfileTable.default()
    blocked = []
    for s in specs:
        res = place(s, view, prof, CFG)
        if hasattr(res, "node_index"):
            view.allocate(to_allocation(s, res, 0.0))
        elif res.reason == "Resources":
            blocked.append(s)
    n = len(ns)
    suspended = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    empty = view.whole_free >= view.gpu_total
    suspended &= empty
    idle = np.where(empty, 1e6, np.nan)
    reserved = tuple(i for i in range(n) if data.draw(st.booleans()))
    p = _plan(view, idle, suspended=suspended, blocked=blocked, reserved=reserved)
    from libs.policy import filters as F

    needed = np.zeros(n, dtype=bool)
    for s in blocked:
        needed |= F.static_mask(s, view)
    for i in p.suspend:
        assert empty[i] and not suspended[i] and i not in reserved and not needed[i]
    for i in p.resume:
        assert suspended[i] and needed[i]
    assert len(set(p.suspend) & set(p.resume)) == 0


@settings(max_examples=60, deadline=None)
@given(jobs(max_jobs=12), st.integers(1, 12))
def test_demand_from_shape_indices_groups_like_the_specs(specs, cap):
    """``Demand.of_shapes`` (the queue's shape indices) gives the groups ``Demand.of`` gives
    for the same jobs: same request shapes, same counts, same order."""
    from libs.policy.filters import shape_key
    from libs.policy.power import Demand
    from libs.policy.queue import PendingQueue
    from libs.policy.types import PendingJob

    q = PendingQueue([PendingJob(s, 0.0) for s in specs])
    shape_of, _, shape_specs = q.shapes()
    rows = [q.position(s.id) for s in specs]
    a = Demand.of(specs, cap).groups
    b = Demand.of_shapes(shape_of[rows], shape_specs, cap).groups
    assert [(shape_key(s), n) for s, n in a] == [(shape_key(s), n) for s, n in b]


@settings(max_examples=40, deadline=None)
@given(nodes(), jobs(max_jobs=12), st.integers(1, 12), st.data())
def test_kept_static_masks_and_gangs_are_the_demands_own(ns, specs, cap, data):
    """The power state hands a new ``Demand`` its groups' static masks and gangs from the
    queue's per-shape arrays (``PowerState._keep_static``): the same as the ones the
    ``Demand`` builds itself, for any blocked subset of the queue in any order."""
    from libs.policy.power import Demand
    from libs.policy.power_state import PowerState
    from libs.policy.queue import PendingQueue
    from libs.policy.types import PendingJob

    view = ClusterView.build(ns)
    q = PendingQueue([PendingJob(s, 0.0) for s in specs])
    shape_of, _, shape_specs = q.shapes()
    rows = data.draw(st.permutations(range(len(specs))))[: data.draw(st.integers(0, len(specs)))]
    ids = shape_of[list(rows)] if rows else np.zeros(0, dtype=np.int64)
    cfg = dataclasses.replace(CFG, power_demand_cap=cap)
    state = PowerState(view, cfg, ProfileTable.default())
    kept = Demand.of_shapes(ids, shape_specs, cap)
    state._keep_static(kept, ids, shape_specs)
    own = Demand.of_shapes(ids, shape_specs, cap)
    assert np.array_equal(kept.static_masks(view), own.static_masks(view))
    assert kept.gang_specs(view) == own.gang_specs(view)
