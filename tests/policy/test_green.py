"""Energy-tolerant ("green") jobs: a long job that declared a high energy_sensitivity goes to
the greener GPU when one is free, may start there at once (the slow-GPU guard lets it), and
its blocked demand wakes the greenest suspended node; an urgent job (high priority or a
deadline), a job that does not tolerate the slowdown, or an overly long one keeps going fast."""

from __future__ import annotations

import dataclasses

import pytest
from msgspec.structs import replace

from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.inventory import seed_cluster
from libs.policy.placement import place
from libs.policy.profiles import ProfileTable
from libs.policy.scheduler import schedule
from libs.policy.scores import green_tolerance, is_green
from libs.policy.types import PendingJob, Placement
from libs.sim.baselines import make_policy
from libs.sim.engine import Engine
from libs.sim.state import COMPLETED
from proto.jobs import HIGH_PRIORITY, JobSpec
from tests.policy.strategies import node_spec
from tests.sim.helpers import job

P = ProfileTable.default()
CFG = PolicyConfig.default()
DAY_S = 86400.0


def _green_spec(**kw) -> JobSpec:
    base = dict(
        id="g",
        gpus=8,
        gpu_mem_gb=8,
        workload_class="cnn",
        est_runtime_s=2 * DAY_S,
        priority=3,
        energy_sensitivity=0.9,
    )
    return JobSpec(**{**base, **kw})


def test_green_tolerance_is_zero_for_urgent_jobs():
    g = _green_spec()
    assert green_tolerance(g) == pytest.approx(0.9) and is_green(g, CFG)
    assert green_tolerance(replace(g, priority=HIGH_PRIORITY)) == 0.0
    assert green_tolerance(replace(g, deadline=1e9)) == 0.0
    assert not is_green(replace(g, energy_sensitivity=0.1), CFG)
    assert not is_green(replace(g, est_runtime_s=CFG.green_max_runtime_s + 1.0), CFG)


def test_long_green_job_takes_the_free_greener_gpu_and_urgent_ones_do_not():
    v = ClusterView.build([node_spec("t4", 8, "t4", 16), node_spec("a100", 8, "a100-80gb", 80)])
    g = _green_spec()
    assert P.power_w("t4", "cnn") / P.speed("t4", "cnn") < P.power_w("a100-80gb", "cnn") / P.speed(
        "a100-80gb", "cnn"
    )
    p = place(g, v, P, CFG)
    assert isinstance(p, Placement) and p.node_id == "t4"
    for urgent in (
        replace(g, priority=HIGH_PRIORITY),
        replace(g, deadline=1e9),
        replace(g, energy_sensitivity=0.1),
    ):
        q = place(urgent, v, P, CFG)
        assert isinstance(q, Placement) and q.node_id == "a100", urgent
    # a transformer is barely greener on the T4 (and 4.5x slower): even a tolerant one stays
    t = place(replace(g, workload_class="transformer", energy_sensitivity=0.6), v, P, CFG)
    assert isinstance(t, Placement) and t.node_id == "a100"


def test_slow_guard_lets_a_green_job_start_on_the_slow_gpu_at_once():
    # only the T4 node is up (the A100 node is cordoned, e.g. suspended)
    v = ClusterView.build(
        [node_spec("t4", 8, "t4", 16), node_spec("a100", 8, "a100-80gb", 80)], cordoned=["a100"]
    )

    def run(spec: JobSpec):
        return schedule(
            [PendingJob(spec, 0.0)], v.copy(), [], now=0.0, tenant_usage={}, profiles=P, cfg=CFG
        )

    green = run(_green_spec())
    assert len(green.assignments) == 1 and green.assignments[0][1].node_id == "t4"
    for held in (
        _green_spec(energy_sensitivity=0.1),
        _green_spec(est_runtime_s=CFG.green_max_runtime_s + DAY_S),
        _green_spec(deadline=1e9),
    ):
        r = run(held)
        assert r.assignments == [] and r.waiting["g"] == "SlowGPU", held


def test_a_high_priority_job_is_not_held_for_a_fast_gpu_while_a_slower_one_has_room():
    """Issue 15, item 5: the guard never makes a high-priority job wait while capacity exists.
    The A100 node is asleep or busy (cordoned here), the T4 node is awake and empty: a two-day
    high-priority job starts on the T4 at once (on main it waited SlowGPU for its whole loss,
    days); with ``guard_holds_high`` it is held as before."""
    v = ClusterView.build(
        [node_spec("t4", 8, "t4", 16), node_spec("a100", 8, "a100-80gb", 80)], cordoned=["a100"]
    )
    spec = _green_spec(priority=HIGH_PRIORITY, energy_sensitivity=0.0)

    def run(cfg: PolicyConfig):
        return schedule(
            [PendingJob(spec, 0.0)], v.copy(), [], now=60.0, tenant_usage={}, profiles=P, cfg=cfg
        )

    now = run(CFG)
    assert len(now.assignments) == 1 and now.assignments[0][1].node_id == "t4"
    held = run(dataclasses.replace(CFG, guard_holds_high=True))
    assert held.assignments == [] and held.waiting["g"] == "SlowGPU"
    # with the fast node free as well, the job still takes the fast one
    both = ClusterView.build([node_spec("t4", 8, "t4", 16), node_spec("a100", 8, "a100-80gb", 80)])
    r = schedule([PendingJob(spec, 0.0)], both, [], now=60.0, tenant_usage={}, profiles=P, cfg=CFG)
    assert len(r.assignments) == 1 and r.assignments[0][1].node_id == "a100"


def test_a_slower_and_hungrier_gpu_is_held_longer_than_the_time_loss():
    # an RNN on the A100 is slower than on the V100 and draws twice the energy per unit of
    # work: the job waits for the V100 (busy here: cordoned) energy_guard_factor x its loss
    assert P.speed("a100-80gb", "rnn") < P.speed("v100-32gb", "rnn")
    v = ClusterView.build(
        [node_spec("v100", 4, "v100-32gb", 32), node_spec("a100", 8, "a100-80gb", 80)],
        cordoned=["v100"],
    )
    spec = JobSpec(id="r", gpus=4, gpu_mem_gb=8, workload_class="rnn", est_runtime_s=DAY_S)
    loss = P.runtime_s(spec, "a100-80gb") - P.runtime_s(spec, "v100-32gb")
    assert CFG.energy_guard_factor > 1.0

    def run(waited: float):
        return schedule(
            [PendingJob(spec, 0.0)], v.copy(), [], now=waited, tenant_usage={}, profiles=P, cfg=CFG
        )

    held = run(loss + 1.0)  # the plain slow-GPU guard would let it go here
    assert held.assignments == [] and held.waiting["r"] == "SlowGPU"
    late = run(CFG.energy_guard_factor * loss + 1.0)
    assert len(late.assignments) == 1 and late.assignments[0][1].node_id == "a100"


def _engine_run(spec_kw: dict):
    """Everything suspended (no warm reserve), then one long 8-GPU job arrives."""
    cfg = dataclasses.replace(CFG, warm_reserve_frac=0.0)
    trace = [
        job("warm", 0.0, 60.0, gpus=1),
        job(
            "late",
            20_000.0,
            DAY_S,
            gpus=8,
            mem=8.0,
            host=8.0,
            cpus=2.0,
            workload_class="cnn",
            **spec_kw,
        ),
    ]
    run = Engine(trace, seed_cluster(48), make_policy("mosaic", cfg=cfg), P).run()
    assert all(j.state == COMPLETED for j in run.jobs)
    return {j.spec.id: j for j in run.jobs}["late"]


def test_green_demand_wakes_the_greenest_node_and_urgent_demand_the_fastest():
    green = _engine_run({"priority": 3, "energy_sensitivity": 0.9})
    assert green.model == "t4"
    urgent = _engine_run({"priority": HIGH_PRIORITY + 1, "energy_sensitivity": 0.9})
    assert urgent.model == "a100-80gb"


def test_a_narrow_job_is_not_green():
    """Issue 15, natural load: a narrow job saves little energy per second of delay on a T4
    (``PolicyConfig.green_min_gpus``), so a tolerant one-GPU job goes fast when a fast GPU is
    free and is held off the T4 like any other job (before the rule it took the T4)."""
    one = _green_spec(gpus=1)
    narrow = _green_spec(gpus=CFG.green_min_gpus - 1)
    assert not is_green(one, CFG) and not is_green(narrow, CFG)
    assert is_green(_green_spec(gpus=CFG.green_min_gpus), CFG)
    v = ClusterView.build([node_spec("t4", 8, "t4", 16), node_spec("a100", 8, "a100-80gb", 80)])
    r = schedule(
        [PendingJob(one, 0.0)], v.copy(), [], now=0.0, tenant_usage={}, profiles=P, cfg=CFG
    )
    assert len(r.assignments) == 1 and r.assignments[0][1].node_id == "a100"
    old = dataclasses.replace(CFG, green_min_gpus=0.0)
    r = schedule(
        [PendingJob(one, 0.0)], v.copy(), [], now=0.0, tenant_usage={}, profiles=P, cfg=old
    )
    assert len(r.assignments) == 1 and r.assignments[0][1].node_id == "t4"
