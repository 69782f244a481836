"""Where a service replica goes (libs.policy.stages.pack; issue 16): fast enough, packed. The
vectorised pick equals the per-node definition; replicas stack on GPUs already holding
fractions, then on the node with the fewest whole free GPUs, so whole nodes stay whole for wide
training; a model too slow for the latency target is taken only when nothing else fits; a
fraction that is no replica keeps the scored pick."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.placement import place, to_allocation
from libs.policy.profiles import ProfileTable
from libs.policy.stages import pack as PK
from libs.policy.types import Placement
from proto.jobs import JobSpec
from tests.policy.strategies import node_spec

PROFILES = ProfileTable.default()
CFG = PolicyConfig.default()
REPLICA = JobSpec(
    id="chat-0", gpus=0.25, gpu_mem_gb=8.0, host_mem_gb=1.0, cpus=1.0, priority=8,
    kind="inference", workload_class="inference", latency_p99_ms=100.0,
    solo_latency_p99_ms=90.0, service="chat", constraints=("a100-80gb", "v100-32gb"),
)  # fmt: skip


def _cluster() -> ClusterView:
    ns = [node_spec(f"a100-{i}", 8, "a100-80gb", 80.0, host=512.0, cpus=96) for i in range(3)]
    ns += [node_spec(f"v100-{i}", 4, "v100-32gb", 32.0, host=256.0, cpus=48) for i in range(2)]
    return ClusterView.build(ns)


def _put(v: ClusterView, spec: JobSpec) -> Placement:
    p = place(spec, v, PROFILES, CFG)
    assert isinstance(p, Placement), p
    v.allocate(to_allocation(spec, p, 0.0))
    return p


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 9).flatmap(lambda n: st.tuples(*[
    st.tuples(st.booleans(), st.booleans(), st.booleans(), st.integers(0, 8),
              st.sampled_from([0.0, 0.25, 0.5, 0.7, 1.0]))
    for _ in range(n)
])))  # fmt: skip
def test_pick_is_the_definition(rows):
    fast, risky, joins, whole, total = (np.array(c) for c in zip(*rows, strict=True))
    facts = [PK.NodeFacts(*r) for r in rows]
    want = min(range(len(rows)), key=lambda i: PK.replica_key(facts[i], i))
    assert PK.replica_pick(fast, risky, joins, whole, total) == want


def test_replicas_pack_and_whole_nodes_stay_whole():
    v = _cluster()
    placed = [_put(v, replace(REPLICA, id=f"chat-{i}")) for i in range(30)]
    slots = {(p.node_id, p.gpu_indices[0]) for p in placed}
    per_gpu = max(sum(1 for p in placed if (p.node_id, p.gpu_indices[0]) == s) for s in slots)
    assert len(slots) == math.ceil(30 / per_gpu)  # no GPU opened while one could be joined
    nodes = {n for n, _ in slots}
    assert len(nodes) <= math.ceil(len(slots) / 4) + 1  # best fit: the small nodes first
    for i, nid in enumerate(v.node_ids):
        if nid not in nodes:
            assert v.whole_free[i] == v.gpu_total[i]  # untouched nodes are whole
    wide = JobSpec(id="train", gpus=8.0, gpu_mem_gb=40.0, host_mem_gb=64.0, cpus=32.0)
    assert isinstance(place(wide, v, PROFILES, CFG), Placement)


def test_partly_used_node_before_a_whole_one():
    v = _cluster()
    _put(v, JobSpec(id="t", gpus=6.0, gpu_mem_gb=40.0, host_mem_gb=64.0, cpus=32.0))
    p = _put(v, REPLICA)
    i = v.node_ids.index(p.node_id)
    assert v.whole_free[i] == 1  # the A100 node the 6-GPU job left 2 GPUs on, not a whole node


def test_too_slow_only_when_nothing_else_fits():
    t4 = node_spec("t4-0", 8, "t4", 16.0, host=256.0, cpus=48)
    ns = [t4, node_spec("v100-0", 4, "v100-32gb", 32.0, host=256.0, cpus=48)]
    v = ClusterView.build(ns)
    free = replace(REPLICA, constraints=())
    _put(v, JobSpec(id="t", gpus=7.0, gpu_mem_gb=8.0, host_mem_gb=8.0, cpus=8.0))
    assert _put(v, free).node_id == "v100-0"  # the T4 (0.45x) would put it at 200 ms
    _put(v, JobSpec(id="u", gpus=3.0, gpu_mem_gb=8.0, host_mem_gb=8.0, cpus=8.0))
    for k in range(2):  # the V100 GPU left fills up (3 a GPU), then the T4 is all there is
        assert _put(v, replace(free, id=f"chat-{k + 1}")).node_id == "v100-0"
    assert _put(v, replace(free, id="chat-9")).node_id == "t4-0"


def test_a_fraction_that_is_no_replica_keeps_the_scored_pick():
    spec = replace(REPLICA, service="", kind="training", workload_class="cnn")
    assert not PK.applies(spec) and PK.applies(REPLICA)
    assert not PK.applies(replace(REPLICA, gpus=1.0))  # a whole-GPU replica: no fractions
