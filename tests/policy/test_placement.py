"""Placement: hard rules hold on random clusters, gangs stay on one node, fractions pack,
refusals say why, the GPU-only baseline really ignores memory."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given, settings
from msgspec.structs import replace

from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.filters import whole_gpus
from libs.policy.inventory import demo_cluster
from libs.policy.placement import first_fit, never_fits, place, to_allocation
from libs.policy.profiles import ProfileTable
from libs.policy.types import Placement, Refusal
from proto.gpus import matches
from proto.jobs import JobSpec
from proto.nodes import NodeSpec
from tests.policy.strategies import jobs, node_spec, nodes


def energy_per_work_j(model: str, workload_class: str, profiles: ProfileTable) -> float:
    """Joules per GPU per reference-second of work: active power / relative speed."""
    return profiles.power_w(model, workload_class) / profiles.speed(model, workload_class)


PROFILES = ProfileTable.default()
CFG = PolicyConfig.default()


def _node(i: str, model: str, g: int, mem: float) -> NodeSpec:
    return node_spec(i, g, model, mem, host=256.0, cpus=64, idle_w=30.0)


def _place_all(ns, js):
    v = ClusterView.build(ns)
    out = []
    for spec in js:
        p = place(spec, v, PROFILES, CFG)
        if isinstance(p, Placement):
            v.allocate(to_allocation(spec, p, 0.0))
            out.append((spec, p))
        else:
            assert isinstance(p, Refusal) and p.reason
    return v, out


@settings(max_examples=60, deadline=None)
@given(nodes(), jobs())
def test_hard_rules_on_random_clusters(ns, js):
    v, placed = _place_all(ns, js)
    by_id = {n.id: n for n in ns}
    share = defaultdict(float)
    mem = defaultdict(float)
    host = defaultdict(float)
    cpus = defaultdict(float)
    for spec, p in placed:
        node = by_id[p.node_id]
        assert node.gpu_mem_gb >= spec.gpu_mem_gb  # GPU memory is a hard rule
        assert not spec.constraints or any(matches(c, node.gpu_model) for c in spec.constraints)
        if spec.gpus >= 1:
            assert len(p.gpu_indices) == whole_gpus(spec) == len(set(p.gpu_indices))  # gang
            assert p.gpu_share == 1.0
        else:
            assert len(p.gpu_indices) == 1 and p.gpu_share == spec.gpus
        for j in p.gpu_indices:
            assert 0 <= j < node.gpu_count
            share[(p.node_id, j)] += p.gpu_share
            mem[(p.node_id, j)] += spec.gpu_mem_gb
        host[p.node_id] += spec.host_mem_gb
        cpus[p.node_id] += spec.cpus
    for s in share.values():
        assert s <= 1.0 + 1e-9
    for (nid, _), m in mem.items():
        assert m <= by_id[nid].gpu_mem_gb + 1e-9
    for nid, h in host.items():
        assert h <= by_id[nid].host_mem_gb + 1e-9
    for nid, c in cpus.items():
        assert c <= by_id[nid].cpus + 1e-9
    assert (v.gpu_free >= -1e-9).all()


@settings(max_examples=25, deadline=None)
@given(nodes(), jobs())
def test_deterministic(ns, js):
    _, a = _place_all(ns, js)
    _, b = _place_all(ns, js)
    assert [(s.id, p.node_id, p.gpu_indices, p.score) for s, p in a] == [
        (s.id, p.node_id, p.gpu_indices, p.score) for s, p in b
    ]


def test_two_halves_share_one_gpu():
    v = ClusterView.build([_node("n0", "v100-32gb", 4, 32), _node("n1", "v100-32gb", 4, 32)])
    placed = []
    for k in range(2):
        spec = JobSpec(id=f"h{k}", gpus=0.5, gpu_mem_gb=8)
        p = place(spec, v, PROFILES, CFG)
        assert isinstance(p, Placement)
        v.allocate(to_allocation(spec, p, 0.0))
        placed.append((p.node_id, p.gpu_indices))
    assert placed[0] == placed[1]  # best fit: the second half fills the first half's GPU
    assert v.free_gpus().sum() == 7


def test_best_fit_prefers_the_fullest_gpu_that_fits():
    v = ClusterView.build([_node("n0", "v100-32gb", 4, 32)])
    for j, used in ((0, 0.25), (1, 0.5), (2, 0.75)):
        spec = JobSpec(id=f"u{j}", gpus=used, gpu_mem_gb=1)
        from libs.policy.types import Placement as P

        v.allocate(to_allocation(spec, P(0, "n0", (j,), used, 0.0, {}), 0.0))
    p = place(JobSpec(id="q", gpus=0.5, gpu_mem_gb=1), v, PROFILES, CFG)
    assert isinstance(p, Placement) and p.gpu_indices == (1,)  # 0.5 free: exact fit


def test_gang_needs_one_node_with_enough_free_gpus():
    v = ClusterView.build([_node("n0", "v100-32gb", 4, 32), _node("n1", "v100-32gb", 4, 32)])
    for nid, idx in (("n0", (0, 1)), ("n1", (0, 1))):
        spec = JobSpec(id=f"b{nid}", gpus=2, gpu_mem_gb=1)
        v.allocate(to_allocation(spec, Placement(v.index[nid], nid, idx, 1.0, 0.0, {}), 0.0))
    r = place(JobSpec(id="g", gpus=4, gpu_mem_gb=1), v, PROFILES, CFG, explain=True)
    assert isinstance(r, Refusal)  # 4 GPUs free in total, but never 4 on one node
    assert r.reason == "Resources" and not r.never_fits
    assert r.per_node["n0"].startswith("Resources")


def test_gpu_memory_is_a_hard_rule_and_baseline_ignores_it():
    ns = [_node("t4-0", "t4", 8, 16), _node("a100-0", "a100-80gb", 8, 80)]
    v = ClusterView.build(ns)
    spec = JobSpec(id="big", gpus=1, gpu_mem_gb=40)
    p = place(spec, v, PROFILES, CFG)
    assert isinstance(p, Placement) and p.node_id == "a100-0"
    ff = first_fit(spec, v)
    assert isinstance(ff, Placement) and ff.node_id == "a100-0"
    naive = first_fit(spec, v, check_memory=False)
    assert isinstance(naive, Placement) and naive.node_id == "t4-0"  # will OOM: the baseline
    v.allocate(to_allocation(spec, naive, 0.0))  # memory may go negative, shares may not
    assert v.gpu_mem_free_gb[0, 0] < 0


def test_refusal_reasons_and_never_fits():
    ns = demo_cluster()
    v = ClusterView.build(ns, cordoned=[n.id for n in ns if n.gpu_model == "a100-80gb"])
    cases = {
        JobSpec(id="c", constraints=("h100",)): "Constraints",
        JobSpec(id="m", gpu_mem_gb=100): "GpuMemory",
        JobSpec(id="g", gpus=48, gpu_mem_gb=1): "GpuCount",  # > any model's nodes together
        JobSpec(id="h", host_mem_gb=1000): "HostMemory",
    }
    for spec, reason in cases.items():
        r = place(spec, v, PROFILES, CFG, explain=True)
        assert isinstance(r, Refusal) and r.never_fits and r.reason == reason
        assert never_fits(spec, ns).startswith(reason)
        assert len(r.per_node) == len(ns)
    # fits only an A100, and every A100 is cordoned: not never, but Cordoned
    r = place(JobSpec(id="a", gpu_mem_gb=60), v, PROFILES, CFG)
    assert isinstance(r, Refusal) and r.reason == "Cordoned" and not r.never_fits
    assert never_fits(JobSpec(id="ok", gpus=8, gpu_mem_gb=60), ns) is None


def test_hot_nodes_are_filtered_and_headroom_scored():
    ns = [_node("a", "v100-32gb", 4, 32), _node("b", "v100-32gb", 4, 32)]
    v = ClusterView.build(ns, temp_c={"a": 90.0, "b": 50.0})
    p = place(JobSpec(id="x", gpu_mem_gb=1), v, PROFILES, CFG, explain=True)
    assert isinstance(p, Placement) and p.node_id == "b"
    v.set_temp("b", 86.0)
    r = place(JobSpec(id="x", gpu_mem_gb=1), v, PROFILES, CFG)
    assert isinstance(r, Refusal) and r.reason == "Thermal"


def test_energy_sensitive_job_prefers_greener_gpu():
    # On ResNet-50 the T4 does a unit of work for less energy than the A100 (2.3x slower at
    # ~1/5.7 of the power): the energy term says so, and only an energy-sensitive job follows it.
    ns = [_node("t4", "t4", 8, 16), _node("a100", "a100-80gb", 8, 80)]
    v = ClusterView.build(ns)
    greener = min(("t4", "a100-80gb"), key=lambda m: energy_per_work_j(m, "cnn", PROFILES))
    assert greener == "t4"
    spec = JobSpec(id="e", gpu_mem_gb=8, workload_class="cnn", energy_sensitivity=1.0)
    p = place(spec, v, PROFILES, CFG, explain=True)
    assert isinstance(p, Placement)
    terms = {c.node_id: c.terms for c in p.candidates}
    assert terms["t4"]["energy"] == pytest.approx(1.0) and terms["a100"]["energy"] < 1.0
    assert terms["a100"]["speed"] == pytest.approx(1.0) and terms["t4"]["speed"] < 1.0
    fast = place(replace(spec, energy_sensitivity=0.0), v, PROFILES, CFG, explain=True)
    assert isinstance(fast, Placement) and fast.node_id == "a100"
    assert p.node_id == "t4"
