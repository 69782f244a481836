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
from libs.sim.baselines.mosaic import Mosaic
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


class _NoPowerMemo(Mosaic):
    """Mosaic with the power step's memos emptied before every step: each step decides from
    scratch (the oracle for the memoised steps)."""

    def power_step(self, now: float):
        self._last_step = None
        self._plan_key = None
        return super().power_step(now)


def _waves() -> list:
    """Waves of mixed jobs (fractions to whole nodes, minutes to hours) with quiet gaps, so
    nodes empty at different times, fall asleep and are woken while others stay busy."""
    out = []
    for w, t0 in enumerate((0.0, 9_000.0, 30_000.0, 31_000.0, 80_000.0)):
        for i in range(40):
            gpus = (0.5, 1.0, 2.0, 4.0, 8.0)[(i * 7 + w) % 5]
            runtime = 600.0 * (1 + (i * 13 + w) % 9)
            out.append(job(f"w{w}-{i}", t0 + 37.0 * i, runtime, gpus=gpus, priority=i % 10))
    return out


def test_power_memos_decide_as_a_step_from_scratch():
    trace = _waves()
    cfg = PolicyConfig.default()
    runs = []
    for policy in (Mosaic(cfg), _NoPowerMemo(cfg)):
        eng = Engine(trace, NODES, policy, PROFILES)
        runs.append(eng.run())
    memo, fresh = runs
    assert fresh.node_suspend_s > 0  # the trace exercises suspends (and so resumes)
    assert memo.node_suspend_s == fresh.node_suspend_s
    assert memo.idle_saved_j == fresh.idle_saved_j

    def life(run):
        return [(j.spec.id, j.first_start_s, j.end_s, j.model, j.energy_active_j) for j in run.jobs]

    assert life(memo) == life(fresh)


def test_power_memo_sees_the_warm_reserve_free_up():
    """An empty A100 node is due to sleep but the warm reserve keeps it up, while the other
    A100 node is full; a job ending there (the node stays busy: no node empties) frees enough
    A100 GPUs for the reserve, and the empty node must go to sleep then, not only when the
    next node empties."""
    cfg = dataclasses.replace(PolicyConfig.default(), warm_reserve_frac=0.2)
    trace = [
        job("long", 0.0, 10_000.0, gpus=4.0, constraints=("a100",)),
        job("short", 1.0, 5_000.0, gpus=4.0, constraints=("a100",)),
        # an event in between, so that a step decides nothing while the A100 node is due
        job("tick", 1_000.0, 100.0, gpus=1.0, constraints=("t4",)),
    ]
    runs = [Engine(trace, NODES, p, PROFILES).run() for p in (Mosaic(cfg), _NoPowerMemo(cfg))]
    memo, fresh = runs
    models = {j.spec.id: j.model for j in fresh.jobs}
    assert models == {"long": "a100-80gb", "short": "a100-80gb", "tick": "t4"}
    assert memo.node_suspend_s == fresh.node_suspend_s
    assert memo.idle_saved_j == fresh.idle_saved_j
