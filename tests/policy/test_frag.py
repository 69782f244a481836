"""FGD's fragmentation measure (``stages.frag``) against hand-worked nodes, and its growth."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.policy.cluster import ClusterView
from libs.policy.stages.frag import (
    Workload,
    cluster_fragmentation,
    fragmentation_of_view,
    growth,
    node_fragmentation,
)
from proto.jobs import JobSpec
from proto.ledger import Allocation
from tests.policy.strategies import node_spec


def spec(jid: str, gpus: float, cpus: float = 1.0, mem: float = 1.0, cons=()) -> JobSpec:
    return JobSpec(id=jid, gpus=gpus, cpus=cpus, host_mem_gb=mem, gpu_mem_gb=0.0,
                   constraints=cons)  # fmt: skip


# half-GPU tasks half the time, 1-GPU and 2-GPU tasks a quarter each
WORK = Workload.learn([spec("a", 0.5), spec("b", 0.5), spec("c", 1.0), spec("d", 2.0)])


def one(free, cpus=10.0, mem=100.0, work=WORK, allowed=None) -> float:
    g = np.array([free], dtype=float)
    al = np.ones((len(work.probs), 1), dtype=bool) if allowed is None else allowed
    return float(node_fragmentation(g, np.array([cpus]), np.array([mem]), al, work)[0])


def test_learn_counts_classes_and_takes_medians():
    w = Workload.learn([spec("a", 0.5, cpus=2), spec("b", 0.5, cpus=6), spec("c", 1, cpus=4)])
    assert w.gpus.tolist() == [0.5, 1.0] and w.probs.tolist() == pytest.approx([2 / 3, 1 / 3])
    assert w.cpus.tolist() == [4.0, 4.0]
    with pytest.raises(ValueError):
        Workload.learn([])


def test_hand_worked_node():
    # free [1.0, 0.3]: a half runs (GPU 0), only the 0.3 is a fragment for it; a 1-GPU task
    # runs, the 0.3 is a fragment; a 2-GPU task cannot run, all 1.3 free is.
    assert one([1.0, 0.3]) == pytest.approx(0.5 * 0.3 + 0.25 * 0.3 + 0.25 * 1.3)
    # an empty 2-GPU node: everything runs, nothing is a fragment
    assert one([1.0, 1.0]) == pytest.approx(0.0)
    # [0.5, 0.3]: halves run (0.3 fragment); 1- and 2-GPU tasks cannot: 0.8 each
    assert one([0.5, 0.3]) == pytest.approx(0.5 * 0.3 + 0.5 * 0.8)
    # a full node has no fragment whatever runs there
    assert one([0.0, 0.0]) == pytest.approx(0.0)


def test_cpu_memory_and_model_make_every_free_gpu_a_fragment():
    assert one([1.0, 1.0], cpus=0.5) == pytest.approx(2.0)  # no task gets its 1 CPU
    assert one([1.0, 1.0], mem=0.0) == pytest.approx(2.0)
    t4_only = Workload.learn([spec("a", 1.0, cons=("t4",))])
    assert one([1.0, 1.0], work=t4_only, allowed=np.array([[False]])) == pytest.approx(2.0)


def test_a_cpu_only_class_counts_only_cpu_starved_nodes():
    w = Workload.learn([spec("a", 0.0, cpus=4)])
    assert one([1.0, 0.5], cpus=8, work=w) == pytest.approx(0.0)
    assert one([1.0, 0.5], cpus=2, work=w) == pytest.approx(1.5)


def view_with(nodes, allocs):
    v = ClusterView.build(nodes)
    for node, gpus, share in allocs:
        a = Allocation(job_id=f"x{node}", node=node, gpu_indices=gpus, gpu_share=share,
                       gpu_mem_gb=0, host_mem_gb=0, cpus=0, time=0)  # fmt: skip
        v.allocate(a)
    return v


def test_cluster_is_the_sum_and_models_are_read_from_the_view():
    nodes = [node_spec("a", 2, "t4", 16), node_spec("b", 2, "v100-32gb", 32)]
    v = view_with(nodes, [("a", (1,), 0.7), ("b", (0,), 0.7)])
    per = fragmentation_of_view(v, WORK)
    assert per.tolist() == pytest.approx([one([1.0, 0.3])] * 2)
    assert cluster_fragmentation(v, WORK) == pytest.approx(per.sum())
    t4 = Workload.learn([spec("a", 1.0, cons=("t4",))])
    assert fragmentation_of_view(v, t4).tolist() == pytest.approx([0.3, 1.3])


def test_growth_prefers_the_placement_that_fragments_least():
    # node a: [1.0, 0.5]; node b: [1.0, 1.0]. A half on a's GPU 1 fills it: the 0.5 fragment
    # for 1- and 2-GPU tasks goes away; on b it breaks a whole pair.
    nodes = [node_spec("a", 2), node_spec("b", 2)]
    v = view_with(nodes, [("a", (1,), 0.5)])
    half = spec("h", 0.5)
    fit = np.ones(2, dtype=bool)
    n, slots, g = growth(half, v, fit, WORK, WORK.allowed(v))
    options = {
        (int(i), tuple(np.flatnonzero(s).tolist())): float(x)
        for i, s, x in zip(n, slots, g, strict=True)
    }
    assert set(options) == {(0, (0,)), (0, (1,)), (1, (0,))}  # b's GPUs are alike: one option
    best = min(options, key=options.get)
    assert best == (0, (1,))
    assert options[(0, (1,))] < 0  # filling a half-free GPU removes a fragment


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.1, 0.3, 0.5, 1.0]), min_size=1, max_size=8))
def test_fragmentation_is_at_most_what_is_free(free):
    f = one(free)
    assert -1e-12 <= f <= sum(free) + 1e-9
