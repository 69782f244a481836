"""Gangs in the simulator: Mosaic's multi-node allocation is applied by the engine as the
baselines' is (one allocation per node), a gang starts and ends at once on all its nodes, and
the runner keeps jobs wider than a node for Mosaic (they were dropped before issue 15)."""

from __future__ import annotations

import pytest

from libs.policy.profiles import ProfileTable
from libs.sim.baselines import make_policy
from libs.sim.engine import simulate
from libs.sim.runner import _feasible
from libs.sim.state import COMPLETED
from tests.sim.helpers import job, node

PROFILES = ProfileTable.default()
NODES = [node(f"a{i}", "a100-80gb", 8, 80.0) for i in range(3)]


def test_a_16_gpu_job_runs_on_two_8_gpu_nodes_and_frees_both():
    jobs = [
        job("small", 0.0, 500.0, gpus=4),
        job("gang", 1.0, 1000.0, gpus=16, host=64.0, cpus=16.0),
        job("after", 2.0, 100.0, gpus=8),
    ]
    r = simulate(jobs, NODES, make_policy("mosaic"), PROFILES)
    by = {j.spec.id: j for j in r.jobs}
    assert all(j.state == COMPLETED for j in r.jobs)
    gang = by["gang"]
    assert gang.first_start_s == pytest.approx(1.0)  # two free nodes at once: it starts
    assert gang.attained_gpu_s == pytest.approx(16 * (gang.end_s - gang.first_start_s))
    # "after" (8 GPUs) waits for a whole node: the small job's or the gang's
    assert by["after"].first_start_s >= min(by["small"].end_s, gang.end_s) - 1e-6


def test_a_gang_waits_for_whole_nodes_and_is_not_starved_by_small_jobs():
    """Every node has a 4-GPU job; small 4-GPU jobs keep arriving. The gang (16 GPUs) holds a
    reservation once blocked, so it starts when the first two nodes drain, not after the
    stream of small jobs."""
    jobs = [job(f"r{i}", 0.0, 1000.0, gpus=4) for i in range(3)]
    jobs.append(job("gang", 10.0, 1000.0, gpus=16, priority=5))
    jobs += [job(f"s{i}", 20.0 + 50.0 * i, 5000.0, gpus=4, priority=5) for i in range(30)]
    r = simulate(jobs, NODES, make_policy("mosaic"), PROFILES)
    by = {j.spec.id: j for j in r.jobs}
    assert all(j.state == COMPLETED for j in r.jobs)
    first_end = min(by[f"r{i}"].end_s for i in range(3))
    assert by["gang"].first_start_s <= max(by[f"r{i}"].end_s for i in range(3)) + 1e-6
    assert by["gang"].first_start_s >= first_end - 1e-6


def test_runner_keeps_gangs_for_mosaic():
    jobs = [job("gang", 0.0, 10.0, gpus=16), job("too-wide", 0.0, 10.0, gpus=32)]
    keep, why = _feasible(jobs, NODES)
    assert keep == [0] and sum(why.values()) == 1
