"""The scorer's admission score follows the day/night period in force at the job's queueing,
as the placer's rank does (issue 16): the same ``effective_policy``."""

from __future__ import annotations

from libs.policy.profiles import ProfileTable
from libs.policy.types import PendingJob
from libs.policy_io.overrides import apply_overrides
from proto.jobs import JobSpec
from services.scorer.admission import admission_scores
from tests.sim.helpers import node

H = 3600.0
DAY0 = 20 * 86_400.0


def test_the_admission_score_of_an_inference_job_carries_the_day_boost() -> None:
    cfg, _ = apply_overrides(["calendar.enabled=true"])
    jobs = [
        PendingJob(JobSpec(id="i", gpus=1, gpu_mem_gb=8, kind="inference"), DAY0),
        PendingJob(JobSpec(id="t", gpus=1, gpu_mem_gb=8), DAY0),
    ]

    def scores(hour: float) -> dict[str, float]:
        now = DAY0 + hour * H
        queued = [PendingJob(j.spec, now) for j in jobs]
        adm = admission_scores(
            queued, [node("n")], [], now=now, cfg=cfg, profiles=ProfileTable.default()
        )
        return {s.job.spec.id: s.score for s in adm.scores}

    day, night = scores(12), scores(22)
    assert round(day["i"] - day["t"], 6) == 0.5  # equal jobs but for the kind: the day's boost
    assert round(night["t"] - night["i"], 6) == 0.25  # the night's training boost
