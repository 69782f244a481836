"""The learning rule (libs.policy.profile_learning): the minimum count, the outlier bound, that
it converges to a steady truth, and that its table is what the scheduler then uses."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.policy.profile_learning import (
    POOLED,
    LearningConfig,
    ProfileLearner,
    learn,
    observed_power_w,
    observed_speed,
    source_kind,
)
from libs.policy.profiles import ProfileTable

CFG = LearningConfig()


def test_observed_speed_is_reference_runtime_over_measured() -> None:
    assert observed_speed(3600.0, 1.0, 1800.0) == pytest.approx(2.0)
    assert observed_speed(3600.0, 0.5, 1800.0) == pytest.approx(1.0)  # resumed half-way
    assert observed_speed(3600.0, 1.0, 0.0) is None
    assert observed_speed(math.nan, 1.0, 10.0) is None
    assert observed_power_w(0.1, 1.0, 1800.0) == pytest.approx(200.0)
    assert observed_power_w(0.0, 1.0, 1800.0) is None


def test_an_entry_counts_only_after_min_samples_and_starts_at_their_median() -> None:
    row = None
    for s in (0.5, 9.0):  # one wild sample among the first three
        row = learn(row, s, 250.0, CFG)
        assert not row.counts(CFG)
    row = learn(row, 0.6, 260.0, CFG)
    assert row.counts(CFG) and row.samples == 3
    assert row.speed == pytest.approx(0.6) and row.power_w == pytest.approx(250.0)
    assert row.seed == ()


def test_the_table_changes_only_once_the_pooled_row_counts() -> None:
    base = ProfileTable.default()
    learner = ProfileLearner(base)
    before = base.speed("a100-80gb", "cnn")
    assert not learner.observe("a100-80gb", "cnn", "pytorch", 0.9)
    assert not learner.observe("A100-80GB", "cnn", "jax", 0.9)  # aliases: one key
    assert learner.table() is base
    assert learner.observe("a100-80gb", "cnn", "pytorch", 0.9)
    t = learner.table()
    assert t.speed("a100-80gb", "cnn") == pytest.approx(0.9) != before
    assert source_kind(t.entry("a100-80gb", "cnn")) == "learnt"
    assert source_kind(t.entry("v100-32gb", "cnn")) == "measured"
    assert learner.learnt[("a100-80gb", "cnn", "pytorch")].samples == 2
    assert learner.learnt[("a100-80gb", "cnn", POOLED)].samples == 3


def test_one_outlier_moves_a_counted_entry_by_at_most_the_bound() -> None:
    row = learn(learn(learn(None, 1.0, None, CFG), 1.0, None, CFG), 1.0, None, CFG)
    up = learn(row, 1000.0, None, CFG)
    down = learn(row, 1e-6, None, CFG)
    assert up.speed == pytest.approx(1.0 + CFG.max_step())
    assert down.speed == pytest.approx(1.0 - CFG.alpha * (1 - 1 / CFG.outlier_factor))


def test_it_converges_to_a_steady_truth_within_a_few_jobs() -> None:
    row = None
    for _ in range(CFG.min_samples):
        row = learn(row, 0.4, 180.0, CFG)
    assert row.speed == pytest.approx(0.4)  # steady truth: exact once it counts
    # the truth changes (a driver upgrade): followed within 15 jobs to 2%
    for _ in range(15):
        row = learn(row, 1.2, 180.0, CFG)
    assert row.speed == pytest.approx(1.2, rel=0.02)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(1e-3, 1e3), min_size=1, max_size=40),
    st.floats(1e-3, 1e3),
)
def test_each_step_of_a_counted_entry_is_bounded(seeds: list[float], obs: float) -> None:
    """Whatever came before, one observation changes a counted speed by at most the bound."""
    row = None
    for s in seeds + [1.0] * CFG.min_samples:
        row = learn(row, s, None, CFG)
    new = learn(row, obs, None, CFG)
    assert new.speed > 0
    assert abs(new.speed / row.speed - 1.0) <= CFG.max_step() + 1e-9


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.1, 10.0), min_size=3, max_size=30))
def test_the_estimate_stays_within_the_observations(obs: list[float]) -> None:
    row = None
    for s in obs:
        row = learn(row, s, None, CFG)
    assert min(obs) - 1e-9 <= row.speed <= max(obs) + 1e-9


def test_bad_settings_and_observations_are_refused() -> None:
    with pytest.raises(ValueError):
        LearningConfig(alpha=0.0)
    with pytest.raises(ValueError):
        LearningConfig(min_samples=0)
    with pytest.raises(ValueError):
        learn(None, math.inf, None, CFG)


def test_the_scheduler_places_by_the_newest_table() -> None:
    """Learnt: the A100 runs this class at a tenth of its table speed; the next job goes to
    the V100 (the scheduler's ``use_profiles``, what the placer calls on a new table)."""
    from libs.policy.config import PolicyConfig
    from libs.policy.core import Scheduler
    from libs.policy.types import PendingJob
    from proto.jobs import JobSpec
    from tests.sim.helpers import node

    nodes = [node("v100-0", "v100-32gb"), node("a100-0", "a100-80gb", mem=80.0)]
    base = ProfileTable.default()
    sched = Scheduler(nodes, cfg=PolicyConfig.default(), profiles=base)

    def where(job_id: str) -> str:
        sched.queue_job(PendingJob(JobSpec(id=job_id, workload_class="cnn"), enqueued_at=0.0))
        (p,) = sched.schedule_pass(0.0)
        sched.end_job(job_id, 0.0)
        return p.allocation.node

    assert where("before") == "a100-0"
    learner = ProfileLearner(base)
    for _ in range(CFG.min_samples):
        learner.observe("a100-80gb", "cnn", "pytorch", 0.1)
    sched.use_profiles(learner.table())
    assert where("after") == "v100-0"
