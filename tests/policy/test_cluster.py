"""ClusterView: arrays match the specs, allocate/release are exact inverses, no double booking."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.inventory import demo_cluster
from libs.policy.placement import place, to_allocation
from libs.policy.profiles import ProfileTable
from libs.policy.types import Placement
from proto.jobs import JobSpec
from proto.ledger import Allocation
from tests.policy.strategies import jobs, nodes

PROFILES = ProfileTable.default()
CFG = PolicyConfig.default()


def _arrays(v: ClusterView) -> list[np.ndarray]:
    return [v.gpu_free, v.gpu_mem_free_gb, v.host_mem_free_gb, v.cpus_free, v.whole_free]


def test_build_shapes_demo_cluster():
    v = ClusterView.build(demo_cluster(), cordoned=["t4-0"], temp_c={"a100-0": 70.0})
    assert v.gpu_free.shape == (10, 8)
    assert v.models == ["a100-80gb", "v100-32gb", "t4"]
    assert v.gpu_free[v.index["v100-0"]].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    assert v.free_gpus().sum() == v.total_gpus() == 4 * 8 + 3 * 4 + 3 * 8
    assert v.cordoned[v.index["t4-0"]] and not v.cordoned[v.index["t4-1"]]
    assert v.temp_c[v.index["a100-0"]] == 70.0 and np.isnan(v.temp_c[v.index["a100-1"]])
    assert v.load() == 0.0


def test_allocate_updates_load_and_refuses_double_booking():
    v = ClusterView.build(demo_cluster())
    a = Allocation(
        job_id="x",
        node="v100-0",
        gpu_indices=(0, 1),
        gpu_share=1.0,
        gpu_mem_gb=10,
        host_mem_gb=20,
        cpus=4,
        time=0.0,
    )
    v.allocate(a)
    assert v.free_gpus()[v.index["v100-0"]] == 2
    assert v.load() == pytest.approx(2 / v.total_gpus())
    with pytest.raises(ValueError, match="double booking"):
        v.allocate(Allocation(**{**_fields(a), "job_id": "y", "gpu_share": 0.5}))
    with pytest.raises(ValueError, match="outside node"):
        v.allocate(Allocation(**{**_fields(a), "job_id": "z", "gpu_indices": (7,)}))
    with pytest.raises(ValueError, match="not in the view"):
        v.allocate(Allocation(**{**_fields(a), "node": "nope"}))


def _fields(a: Allocation) -> dict:
    return {f: getattr(a, f) for f in a.__struct_fields__}


@settings(max_examples=40, deadline=None)
@given(nodes(), jobs(), st.randoms(use_true_random=False))
def test_allocate_release_round_trip(ns, js, rnd):
    v = ClusterView.build(ns)
    before = [x.copy() for x in _arrays(v)]
    allocs = []
    for spec in js:
        p = place(spec, v, PROFILES, CFG)
        if isinstance(p, Placement):
            a = to_allocation(spec, p, 0.0)
            v.allocate(a)
            allocs.append(a)
    rnd.shuffle(allocs)
    for a in allocs:
        v.release(a)
    for b, x in zip(before, _arrays(v), strict=True):
        np.testing.assert_allclose(x, b, atol=1e-9)
    assert v.load() == pytest.approx(0.0, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(nodes(), jobs(), st.randoms(use_true_random=False))
def test_empty_gen_moves_exactly_when_a_node_empties_or_fills(ns, js, rnd):
    """``empty_gen`` (what the power step keys on) counts the changes of the empty-node mask
    (``power.empty_nodes``) over allocations and releases in any order."""
    v = ClusterView.build(ns)
    flips = 0
    empty = v.whole_free >= v.gpu_total

    def check() -> None:
        nonlocal flips, empty
        now = v.whole_free >= v.gpu_total
        flips += int((now != empty).sum())
        empty = now
        assert v.empty_gen == flips

    allocs = []
    for spec in js:
        p = place(spec, v, PROFILES, CFG)
        if isinstance(p, Placement):
            allocs.append(to_allocation(spec, p, 0.0))
            v.allocate(allocs[-1])
            check()
    rnd.shuffle(allocs)
    for a in allocs:
        v.release(a)
        check()
    assert not allocs or flips > 0


def test_build_with_allocations_equals_allocating_later():
    ns = demo_cluster()
    a = Allocation(
        job_id="x",
        node="t4-1",
        gpu_indices=(3,),
        gpu_share=0.5,
        gpu_mem_gb=4,
        host_mem_gb=2,
        cpus=1,
        time=0.0,
        spec=JobSpec(id="x", gpus=0.5),
    )
    v1 = ClusterView.build(ns, [a])
    v2 = ClusterView.build(ns)
    v2.allocate(a)
    for x, y in zip(_arrays(v1), _arrays(v2), strict=True):
        np.testing.assert_array_equal(x, y)
    c = v1.copy()
    c.release(a)
    assert v1.gpu_free[v1.index["t4-1"], 3] == 0.5  # the copy is independent


def test_availability_memo_follows_cordons_and_temperatures_only():
    """``filters.available`` is memoised on ``state_gen``: a cordon or a temperature change
    shows at once; allocations and releases do not move it."""
    from libs.policy import filters as F

    v = ClusterView.build(demo_cluster())
    assert F.available(v, CFG).all()
    spec = JobSpec(id="a", tenant="t", gpus=1.0, gpu_mem_gb=8.0)
    a = to_allocation(spec, place(spec, v, PROFILES, CFG), 0.0)
    gen = v.state_gen
    v.allocate(a)
    v.release(a)
    assert v.state_gen == gen
    v.set_cordoned("t4-0", True)
    v.set_temp("a100-0", CFG.thermal_max_c + 1.0)
    avail = F.available(v, CFG)
    assert not avail[v.index["t4-0"]] and not avail[v.index["a100-0"]]
    assert avail.sum() == len(v.node_ids) - 2
    v.set_cordoned("t4-0", False)
    assert F.available(v, CFG)[v.index["t4-0"]]
