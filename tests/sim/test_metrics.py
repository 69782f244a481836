"""Each metric on a trace small enough to compute by hand."""

from __future__ import annotations

import math

import pytest

from libs.sim import metrics as M
from libs.sim.baselines import make_policy
from libs.sim.engine import simulate
from tests.sim.helpers import FlatProfiles, job, node

PROF = FlatProfiles(active_w={"v100-32gb": 250.0}, idle_w={"v100-32gb": 50.0})


def run(jobs, nodes, policy="fifo", **kw):
    r = simulate(jobs, nodes, make_policy(policy), PROF, **kw)
    return r, M.compute(r, tariff_usd_per_kwh=0.10)


def test_two_jobs_one_gpu_queue_jct_energy():
    # one node with 1 GPU; A: t=0 runs 100 s; B: t=10 waits until 100, runs 50 s -> ends 150
    nodes = [node("n0", gpus=1)]
    jobs = [job("a", 0, 100, priority=9), job("b", 10, 50, priority=1)]
    _r, m = run(jobs, nodes)
    assert m["jct_mean_s"] == pytest.approx((100 + 140) / 2)
    assert m["jct_p50_s"] == pytest.approx(120)
    assert m["makespan_s"] == pytest.approx(150)
    assert m["queue_delay_high_mean_s"] == pytest.approx(0)
    assert m["queue_delay_other_mean_s"] == pytest.approx(90)
    assert m["starvation_class"] == 1
    assert m["starvation_max_wait_s"] == pytest.approx(90)
    # allocated the whole 150 s -> allocation ratio 1; busy window: from 10 to 100 B waits
    # (demand 2 > 1 GPU) and from 0 to 10 and 100..150 demand == capacity -> busy all 150 s
    assert m["allocation_ratio"] == pytest.approx(1.0)
    assert m["utilization"] == pytest.approx(1.0)
    assert m["work_utilization"] == pytest.approx(1.0)
    # energy: idle 50 W x 150 s + extra 200 W x 150 s busy = 37,500 J
    assert m["energy_kwh"] == pytest.approx(37_500 / 3.6e6)
    assert m["energy_cost_usd"] == pytest.approx(37_500 / 3.6e6 * 0.10)
    assert m["failure_rate"] == 0 and m["jobs_failed"] == 0
    # slowdowns 1.0 and 140/50 = 2.8
    assert m["ftf_slowdown_mean"] == pytest.approx((1.0 + 2.8) / 2)


def test_idle_gpus_count_in_energy_and_utilization():
    # 2 GPUs, one job of 1 GPU for 100 s: half the capacity idle all the time
    nodes = [node("n0", gpus=2)]
    _r, m = run([job("a", 0, 100)], nodes)
    assert m["allocation_ratio"] == pytest.approx(0.5)
    assert math.isnan(m["utilization"])  # demand never reached capacity
    assert m["energy_kwh"] == pytest.approx((2 * 50 * 100 + 200 * 100) / 3.6e6)


def test_deadline_attainment():
    nodes = [node("n0", gpus=1)]
    jobs = [job("a", 0, 100, deadline=150.0), job("b", 0, 100, deadline=150.0)]
    _, m = run(jobs, nodes)
    assert m["deadline_jobs"] == 2
    assert m["deadline_attainment"] == pytest.approx(0.5)  # the second ends at 200


def test_oom_failure_rate_and_failed_jobs():
    # a 40 GB job on a 16 GB T4: fifo counts GPUs only -> 3 attempts, each dies after 300 s
    nodes = [node("t", model="t4", gpus=1, mem=16.0)]
    _, m = run([job("big", 0, 1000, mem=40.0)], [*nodes, node("a", "a100-80gb", 1, 80.0)])
    # first fit puts it on the T4 (listed first): all three attempts fail, the job ends Failed
    assert m["attempts"] == 3 and m["failed_attempts"] == 3
    assert m["failure_rate"] == pytest.approx(1.0)
    assert m["jobs_failed"] == 1 and m["jobs_failed_rate"] == pytest.approx(1.0)


def test_fragmentation_counts_unusable_free_gpus():
    # node A (4 GPUs): 3 busy for a long time -> 1 free; pending job needs 2 GPUs; node B full
    nodes = [node("a", gpus=4), node("b", gpus=2)]
    jobs = [
        job("x", 0, 1000, gpus=3),
        job("y", 0, 1000, gpus=2),
        job("z", 1, 10, gpus=2),
    ]
    _r, m = run(jobs, nodes, samples=10_000)
    # while z waits (1 .. 1000) the only free GPU cannot hold it: fragmentation 1.0
    assert m["fragmentation"] == pytest.approx(1.0)


def test_jain_index():
    import numpy as np

    assert M.jain(np.array([1.0, 1.0])) == pytest.approx(1.0)
    assert M.jain(np.array([1.0, 0.0])) == pytest.approx(0.5)
