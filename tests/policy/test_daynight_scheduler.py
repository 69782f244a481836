"""The day/night policy in the one scheduler (issue 16): a waiting job's explanation shows the
score its period adds, and the period is the one in force at each tick's ``now``."""

from __future__ import annotations

from libs.policy.core import Scheduler
from libs.policy.profiles import ProfileTable
from libs.policy.types import PendingJob
from libs.policy_io.overrides import apply_overrides
from proto.jobs import JobSpec
from tests.sim.helpers import node

H = 3600.0
DAY0 = 20 * 86_400.0


def test_the_explanation_carries_the_period_boost_and_the_headroom_reason() -> None:
    cfg, _ = apply_overrides(["calendar.enabled=true", "power_saving=false"])
    s = Scheduler([node("n", gpus=1)], cfg=cfg, profiles=ProfileTable.default(), now=DAY0)
    now = DAY0 + 12 * H
    s.queue_job(PendingJob(JobSpec(id="train", gpus=1, gpu_mem_gb=8), now))
    s.queue_job(PendingJob(JobSpec(id="infer", gpus=1, gpu_mem_gb=8, kind="inference"), now))
    s.queue_job(PendingJob(JobSpec(id="late", gpus=1, gpu_mem_gb=8), now))
    d = s.tick(now)
    assert [p.job.spec.id for p in d.places] == ["infer"] and s.period == "day"
    assert d.next_tick_s == DAY0 + 20 * H  # the switch to night
    why = s.explain("train", now)
    assert why is not None and why.terms["day_night"] == 0.0
    s.end_job("infer", now + 60)
    s.cancel_job("infer", now + 60)
    d = s.tick(now + 60)
    assert d.places == [] and s.reason_of("train") == "Headroom"  # 1 GPU of 1 kept (10%)
    d = s.tick(DAY0 + 20 * H)
    assert [p.job.spec.id for p in d.places] == ["train"] and s.period == "night"
    why = s.explain("late", DAY0 + 20 * H)
    assert why is not None and why.terms["day_night"] == 0.25
