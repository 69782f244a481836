"""Power saving in the engine (mosaic only): idle nodes are suspended and resumed for work,
the saving shows in the energy split, and no job ever lands on a node that is not up (the
engine asserts it)."""

from __future__ import annotations

import dataclasses

import pytest

from libs.policy.config import PolicyConfig
from libs.policy.inventory import seed_cluster
from libs.policy.profiles import ProfileTable
from libs.sim import bounds as B
from libs.sim import metrics as M
from libs.sim.baselines import make_policy
from libs.sim.engine import Engine
from libs.sim.state import COMPLETED
from tests.sim.helpers import job

PROFILES = ProfileTable.default()
NODES = seed_cluster(48)


def _bursts() -> list:
    """Two bursts of work 20 h apart: in between, the cluster is empty."""
    out = []
    for b, t0 in enumerate((0.0, 72_000.0)):
        for i in range(24):
            out.append(job(f"b{b}-{i}", t0 + 10.0 * i, 1800.0, gpus=float(1 + i % 4)))
    return out


def _run(cfg: PolicyConfig, trace):
    eng = Engine(trace, NODES, make_policy("mosaic", cfg=cfg), PROFILES)
    bounds = B.compute(
        eng.jobs, eng.cluster.models, eng.cluster.capacity_gpus, eng.idle_total_w, PROFILES
    )
    run = eng.run()
    m = M.compute(run)
    return run, m, B.check(run, m, bounds)


def test_idle_nodes_are_suspended_and_resumed_for_the_next_burst():
    on = PolicyConfig.default()
    off = dataclasses.replace(on, power_saving=False)
    trace = _bursts()
    run_on, m_on, bad_on = _run(on, trace)
    _, m_off, bad_off = _run(off, trace)
    assert bad_on == [] and bad_off == []
    assert all(j.state == COMPLETED for j in run_on.jobs), [
        (j.spec.id, j.state, j.reason) for j in run_on.jobs if j.state != COMPLETED
    ]
    assert m_off["node_suspend_hours"] == 0 and m_off["idle_saved_kwh"] == 0
    # between the bursts nodes sleep: the idle energy drops, the active energy does not change
    assert m_on["node_suspend_hours"] > 0
    assert m_on["energy_idle_kwh"] < m_off["energy_idle_kwh"]
    assert m_on["energy_kwh"] < m_off["energy_kwh"]
    assert m_on["energy_active_kwh"] == pytest.approx(m_off["energy_active_kwh"], rel=0.25)
    # the second burst found capacity (nodes were resumed): every job ran, within the boot
    # time plus the queueing the warm reserve alone would cause
    second = [j for j in run_on.jobs if j.spec.id.startswith("b1-")]
    assert all(j.first_start_s >= j.submit_s for j in second)


def test_baselines_never_suspend():
    trace = _bursts()
    eng = Engine(trace, NODES, make_policy("fifo"), PROFILES)
    m = M.compute(eng.run())
    assert m["node_suspend_hours"] == 0 and m["idle_saved_kwh"] == 0
