"""The energy-JCT frontier (libs.sim.energy_floor): a floor no schedule beats, checked against
every assignment of a small instance, and against a real replay of every policy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.policy.config import PolicyConfig
from libs.policy.inventory import seed_cluster
from libs.policy.profiles import ProfileTable
from libs.sim import bounds as B
from libs.sim import metrics as M
from libs.sim.baselines import make_policy
from libs.sim.energy_floor import floor_j, frontier_kwh, job_tables
from libs.sim.engine import Engine
from libs.sim.power_saving import apply_mode
from tests.sim.helpers import job

instances = st.integers(1, 5).flatmap(
    lambda n: st.tuples(
        st.lists(st.lists(st.floats(10.0, 1e4), min_size=3, max_size=3), min_size=n, max_size=n),
        st.lists(st.lists(st.floats(1.0, 1e6), min_size=3, max_size=3), min_size=n, max_size=n),
        st.floats(1.0, 3.0),
    )
)


@settings(max_examples=150, deadline=None)
@given(instances)
def test_no_assignment_within_the_jct_budget_draws_less_than_the_floor(inst):
    """Brute force: every way to put each job whole on one model whose runtimes keep the mean
    JCT within the ratio draws at least the floor; the floor is at least every job on its
    greenest model and at most every job on its fastest (which always keeps the ratio)."""
    runtime, energy, ratio = (np.array(inst[0]), np.array(inst[1]), inst[2])
    fastest = runtime.min(axis=1)
    floor = floor_j(runtime, energy, fastest, ratio)
    rows = np.arange(len(fastest))
    best = np.inf
    for pick in itertools.product(range(3), repeat=len(fastest)):
        p = np.array(pick)
        if runtime[rows, p].sum() <= ratio * fastest.sum() + 1e-9:
            best = min(best, energy[rows, p].sum())
    assert floor <= best * (1 + 1e-9) + 1e-6
    assert floor >= energy.min(axis=1).sum() * (1 - 1e-9) - 1e-6
    at_fastest = energy[rows, runtime.argmin(axis=1)].sum()
    assert floor <= at_fastest * (1 + 1e-9) + 1e-6


def test_the_floor_falls_as_the_jct_allowed_grows_and_is_exact_at_both_ends():
    # job 0: fast model 1000 J / 100 s, green model 200 J / 200 s; job 1 the same, halved
    runtime = np.array([[100.0, 200.0], [50.0, 100.0]])
    energy = np.array([[1000.0, 200.0], [500.0, 100.0]])
    fastest = runtime.min(axis=1)
    floors = [floor_j(runtime, energy, fastest, r) for r in (1.0, 1.2, 1.5, 2.0, 3.0)]
    assert floors == sorted(floors, reverse=True)
    assert floors[0] == pytest.approx(1500.0)  # no slack: both on the fast model
    assert floors[3] == pytest.approx(300.0)  # twice the bound: both on the green model
    # 1.5x: 75 s of slack buys 75/150 of the switch's 1,200 J saving (the relaxation's slope)
    assert floors[2] == pytest.approx(1500.0 - 0.5 * 1200.0)


def test_a_model_without_the_memory_is_not_open_to_the_job():
    specs = [job("big", 0.0, 3600.0, gpus=8, mem=40.0), job("small", 0.0, 3600.0, gpus=8)]
    eng = Engine(specs, seed_cluster(64), make_policy("fifo"), ProfileTable.default())
    models = eng.cluster.models
    mem = {"a100-80gb": 80.0, "v100-32gb": 32.0, "t4": 16.0}
    runtime, energy, _ = job_tables(eng.jobs, models, ProfileTable.default(), mem)
    t4 = models.index("t4")
    assert np.isinf(runtime[0, t4]) and np.isinf(energy[0, t4])  # 40 GB per GPU > a T4's 16
    assert np.isfinite(runtime[1]).all()  # 8 GB fits everywhere
    open_all = frontier_kwh(eng.jobs, models, ProfileTable.default())
    closed = frontier_kwh(eng.jobs, models, ProfileTable.default(), mem)
    assert closed["2"] > open_all["2"]  # the big job cannot take the greenest model


def test_no_schedule_reaches_the_bound_when_a_jobs_fastest_model_lacks_its_memory():
    # an RNN runs fastest on a V100 (seed profiles); with 40 GB per GPU it cannot run there
    rnn = [job("rnn", 0.0, 3600.0, gpus=1, mem=40.0, workload_class="rnn")]
    eng = Engine(rnn, seed_cluster(64), make_policy("fifo"), ProfileTable.default())
    mem = {"a100-80gb": 80.0, "v100-32gb": 32.0, "t4": 16.0}
    floors = frontier_kwh(eng.jobs, eng.cluster.models, ProfileTable.default(), mem)
    assert floors["1"] is None and floors["2"] is not None
    bounds = {"jct_mean_lb_s": 100.0, "energy_kwh_lb_power_saving_at_jct": floors}
    assert B._frontier_check({"jct_mean_s": 100.0, "energy_kwh": 1e9}, bounds)


def test_no_policy_draws_less_than_the_floor_at_its_own_jct():
    """Every policy with power saving on a small seed-cluster replay: its energy is at least
    the floor at the smallest frontier ratio its mean JCT is within (bounds.check)."""
    trace = [job(f"j{i}", 900.0 * i, 1800.0 + 600.0 * (i % 7), gpus=1 + i % 8) for i in range(60)]
    profiles = ProfileTable.default()
    cfg = PolicyConfig.default()
    for name in ("fifo", "gavel", "mosaic"):
        policy = apply_mode(name, make_policy(name), "all", cfg)
        eng = Engine(trace, seed_cluster(64), policy, profiles)
        bounds = B.compute(
            eng.jobs, eng.cluster.models, eng.cluster.capacity_gpus, eng.idle_total_w, profiles
        )
        run = eng.run()
        m = M.compute(run)
        assert B.check(run, m, bounds) == [], name
        ratio = m["jct_mean_s"] / bounds["jct_mean_lb_s"]
        floors = bounds["energy_kwh_lb_power_saving_at_jct"]
        within = [float(r) for r in floors if float(r) >= ratio]
        assert within, (name, ratio)  # the trace is light: every policy is within 2x the bound
        assert m["energy_kwh"] >= floors[f"{min(within):g}"] * (1 - 1e-9)


def test_check_flags_a_run_below_the_floor():
    bounds = {"jct_mean_lb_s": 100.0, "energy_kwh_lb_power_saving_at_jct": {"1.1": 50.0}}
    assert B._frontier_check({"jct_mean_s": 105.0, "energy_kwh": 40.0}, bounds)
    assert not B._frontier_check({"jct_mean_s": 120.0, "energy_kwh": 40.0}, bounds)
    assert not B._frontier_check({"jct_mean_s": 105.0, "energy_kwh": 60.0}, bounds)
