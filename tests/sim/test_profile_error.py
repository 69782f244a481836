"""--profile-error and --profile-learning (libs.sim.profile_error, libs.sim.profile_feed): the
policy's table is wrong, the engine still runs the truth, and learning brings the table back."""

from __future__ import annotations

import argparse

import pytest

from libs.policy.profiles import ProfileTable
from libs.sim.baselines.mosaic import Mosaic
from libs.sim.engine import Engine
from libs.sim.profile_error import add_profile_args, perturbed, profile_kwargs
from tests.sim.helpers import job, node

NODES = [node("v100-0", "v100-32gb"), node("a100-0", "a100-80gb", mem=80.0)]
MODELS = ["a100-80gb", "v100-32gb"]


def _jobs(n: int = 80):
    classes = ("cnn", "transformer")
    return [
        job(f"j{i}", 600.0 * i, 1800.0, workload_class=classes[i % 2], framework="pytorch")
        for i in range(n)
    ]


def test_the_perturbation_is_seeded_and_bounded() -> None:
    truth = ProfileTable.default().covering(NODES)
    a, b = perturbed(truth, MODELS, 0.3, 1), perturbed(truth, MODELS, 0.3, 1)
    assert a.entries == b.entries and a.entries != perturbed(truth, MODELS, 0.3, 2).entries
    for m in MODELS:
        for c in ("cnn", "rnn", "inference"):
            assert 0.7 <= a.speed(m, c) / truth.speed(m, c) <= 1.3
            assert 0.7 <= a.power_w(m, c) / truth.power_w(m, c) <= 1.3
    assert perturbed(truth, MODELS, 0.0, 1) is truth
    with pytest.raises(ValueError):
        perturbed(truth, MODELS, 1.0, 1)


def _run(**kw):
    truth = ProfileTable.default()
    policy = Mosaic(profile_seed=3, **kw)
    result = Engine(_jobs(), NODES, policy, truth).run()
    return result, policy.profile_report(), truth.covering(NODES), policy


def test_the_engine_runs_the_truth_whatever_the_policy_believes() -> None:
    result, report, truth, _ = _run(profile_error=0.5)
    assert report["log_error_start"] > 0.1 and report["log_error_end"] == report["log_error_start"]
    for j in result.jobs:
        want = j.spec.est_runtime_s / truth.speed(j.model, j.spec.workload_class)
        assert j.end_s - j.start_s == pytest.approx(want)


def test_learning_recovers_the_table_from_completed_jobs() -> None:
    result, report, truth, policy = _run(profile_error=0.5, profile_learning=True)
    assert report["observations"] == 80
    ran = {(j.model, j.spec.workload_class) for j in result.jobs}
    assert report["learnt_rows"] == 2 * len(ran)  # pooled and pytorch rows
    # the rows the jobs ran on are exact again; the untouched classes keep their error
    table = policy.core.profiles
    for m, c in ran:
        assert table.speed(m, c) == pytest.approx(truth.speed(m, c))
        assert table.power_w(m, c) == pytest.approx(truth.power_w(m, c))
    assert report["log_error_end"] < report["log_error_start"]
    assert _run()[1] is None  # the exact table, no learning: nothing to report


def test_the_runner_flags_reach_the_policy() -> None:
    """``--profile-error`` and ``--profile-learning`` become Mosaic's arguments, seeded by
    ``--seed``; without them the run is the exact-profile one."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    add_profile_args(ap)
    args = ap.parse_args(["--profile-error", "0.3", "--profile-learning", "on", "--seed", "7"])
    kw = profile_kwargs(args)["mosaic"]
    assert kw == {"profile_error": 0.3, "profile_learning": True, "profile_seed": 7}
    assert Mosaic(**kw).feed.learning
    assert profile_kwargs(ap.parse_args([])) == {}
    with pytest.raises(SystemExit):
        ap.parse_args(["--profile-learning", "maybe"])
