"""--estimate-noise (libs.sim.loaders.noise): the policy is told a noisy runtime, the engine
still runs the truth, the noise is seeded per job and its log-spread is the sigma asked for."""

from __future__ import annotations

import math

import numpy as np
import pytest

from libs.sim.loaders.noise import noise_factors, noisy_estimates
from libs.sim.runner import main, run_simulation
from libs.sim.trace import TraceJob
from tests.sim.helpers import job


def _trace_jobs(n: int) -> list[TraceJob]:
    return [
        TraceJob(spec=job(f"j{i}", 60.0 * i, 1800.0 + i).spec, submit_s=60.0 * i) for i in range(n)
    ]


def test_factors_are_seeded_per_job_and_not_by_position() -> None:
    ids = [f"job-{i}" for i in range(500)]
    a, b = noise_factors(ids, 0.5, seed=1), noise_factors(ids, 0.5, seed=1)
    assert np.array_equal(a, b)
    assert not np.allclose(a, noise_factors(ids, 0.5, seed=2))
    # the first 100 jobs get the same factors in a short replay as in the long one
    assert np.array_equal(noise_factors(ids[:100], 0.5, seed=1), a[:100])
    # sigma only scales the same normals: a job over-estimated at 0.5 is so at 1.0
    assert np.allclose(np.log(noise_factors(ids, 1.0, seed=1)), 2 * np.log(a))


@pytest.mark.parametrize("sigma", [0.5, 1.0])
def test_the_log_spread_is_sigma_and_the_median_is_one(sigma: float) -> None:
    logs = np.log(noise_factors([f"j{i}" for i in range(20_000)], sigma, seed=7))
    # the std of 20k normal draws is within 2% of sigma (its standard error is 0.5%)
    assert logs.std() == pytest.approx(sigma, rel=0.02)
    assert abs(logs.mean()) < 4 * sigma / math.sqrt(logs.size)
    assert abs(np.median(logs)) < 0.05 * sigma


def test_zero_is_no_change_and_negative_is_refused() -> None:
    jobs = _trace_jobs(20)
    assert noisy_estimates(jobs, 0.0, seed=1) == jobs
    assert np.array_equal(noise_factors(["a", "b"], 0.0, seed=1), np.ones(2))
    for bad in (-0.1, math.nan, math.inf):
        with pytest.raises(ValueError):
            noisy_estimates(jobs, bad, seed=1)


def test_the_factor_is_recorded_and_the_estimate_clipped_at_the_horizon() -> None:
    jobs = noisy_estimates(_trace_jobs(200), 1.0, seed=3)
    for j, truth in zip(jobs, _trace_jobs(200), strict=True):
        assert j.spec.est_runtime_s == pytest.approx(truth.spec.est_runtime_s * j.est_factor)
        assert j.submit_s == truth.submit_s and j.spec.deadline == truth.spec.deadline
    huge = [TraceJob(spec=job("h", 0.0, 300 * 86400.0).spec, submit_s=0.0)]
    clipped = [noisy_estimates(huge, 3.0, seed=s)[0] for s in range(40)]
    assert max(j.spec.est_runtime_s for j in clipped) <= 365 * 86400.0
    assert any(j.est_factor < math.exp(3.0 * 0.1) for j in clipped)  # some under, some clipped


def _sim(noise: float, policies: list[str]) -> tuple[dict, dict]:
    runs: dict = {}
    res = run_simulation(
        "synthetic:120",
        "demo",
        0,
        policies,
        None,
        seed=4,
        load=0.9,
        keep_runs=runs,
        estimate_noise=noise,
    )
    return res, runs


def test_the_engine_runs_the_truth_and_only_the_policy_view_moves() -> None:
    clean, clean_runs = _sim(0.0, ["fifo", "mosaic"])
    noisy, noisy_runs = _sim(1.0, ["fifo", "mosaic"])
    assert clean["estimate_noise"]["sigma"] == 0.0 and noisy["estimate_noise"]["sigma"] == 1.0
    assert noisy["estimate_noise"]["log_factor_std"] > 0.5
    assert clean["load"] == noisy["load"] and clean["bounds"] == noisy["bounds"]
    for name in ("fifo", "mosaic"):
        for a, b in zip(clean_runs[name].jobs, noisy_runs[name].jobs, strict=True):
            assert np.array_equal(a.runtime_s, b.runtime_s)  # the truth is unchanged
            assert b.spec.est_runtime_s == pytest.approx(a.spec.est_runtime_s * b.est_factor)
    # fifo never reads an estimate: its whole run is the same; the work done is the truth's
    timing = ("wall_s", "jobs_per_s")
    assert {k: v for k, v in clean["policies"]["fifo"].items() if k not in timing} == {
        k: v for k, v in noisy["policies"]["fifo"].items() if k not in timing
    }
    m0, m1 = clean["policies"]["mosaic"], noisy["policies"]["mosaic"]
    if m0["jobs_completed"] == m1["jobs_completed"]:
        assert m1["work_ref_gpu_hours"] == pytest.approx(m0["work_ref_gpu_hours"])


def test_the_runner_flag_reaches_results_json(tmp_path) -> None:
    out = tmp_path / "run"
    argv = ["--trace", "synthetic:40", "--cluster", "demo", "--policies", "fifo"]
    assert main([*argv, "--estimate-noise", "0.5", "--seed", "2", "--out", str(out)]) == 0
    import json

    rec = json.loads((out / "results.json").read_text())["estimate_noise"]
    assert rec["sigma"] == 0.5 and rec["seed"] == 2 and "median one" in rec["kind"]
    assert main([*argv, "--estimate-noise", "-1"]) == 2


def test_mosaic_sim_takes_the_flag(tmp_path) -> None:
    import json

    from libs.client.cli import main as cli_main

    out = tmp_path / "cli"
    argv = ["sim", "--trace", "synthetic:30", "--cluster", "demo", "--policies", "fifo"]
    assert cli_main([*argv, "--estimate-noise", "1.0", "--out", str(out)]) == 0
    assert json.loads((out / "results.json").read_text())["estimate_noise"]["sigma"] == 1.0
    assert cli_main([*argv, "--estimate-noise", "-1", "--out", str(out)]) == 2
