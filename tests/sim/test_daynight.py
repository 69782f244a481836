"""The day/night policy in the simulator (issue 16): by day an inference job outranks a training
job it does not outrank by night, and the inference headroom holds training off until the
switch to night, when the engine runs a pass without any event."""

from __future__ import annotations

import pytest

from libs.policy.profiles import ProfileTable
from libs.policy_io.overrides import apply_overrides
from libs.sim.baselines import make_policy
from libs.sim.engine import simulate
from tests.sim.helpers import job, node

PROFILES = ProfileTable.default()
H = 3600.0
DAY0 = 20 * 86_400.0  # a midnight UTC: trace time is Unix time in the calendar's zone


def _starts(jobs, nodes, *sets: str) -> dict[str, float]:
    cfg, _ = apply_overrides(["calendar.enabled=true", "power_saving=false", *sets])
    r = simulate(jobs, nodes, make_policy("mosaic", cfg=cfg), PROFILES)
    return {j.spec.id: j.first_start_s for j in r.jobs}


@pytest.mark.parametrize(("hour", "first"), [(9.0, "infer"), (22.0, "train")])
def test_by_day_inference_outranks_a_training_job_it_does_not_by_night(
    hour: float, first: str
) -> None:
    """One GPU, busy until t0 + 600: a priority-6 training job queued first and a priority-4
    inference job then wait for it. By night the training job's priority wins; by day the
    inference boost (0.5) does. No headroom here, so only the rank decides."""
    t0 = DAY0 + hour * H
    jobs = [
        job("busy", t0, 600.0),
        job("train", t0 + 10, 600.0, priority=6),
        job("infer", t0 + 20, 600.0, priority=4, kind="inference", workload_class="inference"),
    ]
    start = _starts(jobs, [node("v", gpus=1)], "calendar.day.headroom_share=0")
    assert start[first] == pytest.approx(t0 + 600.0)
    assert max(start["train"], start["infer"]) == pytest.approx(t0 + 1200.0)


def test_the_headroom_keeps_gpus_for_inference_until_night() -> None:
    """Four GPUs, a headroom of 25% (1 GPU) by day: at 09:00 three of four training jobs start,
    an inference job at 10:00 takes the kept GPU at once, and the fourth training job starts
    at 20:00 exactly: the pass the scheduler asked for at the switch."""
    t0 = DAY0 + 9 * H
    jobs = [job(f"t{i}", t0 + i, 30 * H) for i in range(4)]
    jobs.append(job("infer", DAY0 + 10 * H, 600.0, kind="inference"))
    start = _starts(jobs, [node("v", gpus=4)], "calendar.day.headroom_share=0.25")
    assert [start[f"t{i}"] for i in range(3)] == [t0, t0 + 1, t0 + 2]
    assert start["infer"] == DAY0 + 10 * H
    assert start["t3"] == DAY0 + 20 * H
