"""A pass's placements are started in ``core.Scheduler`` at once; the driver confirms them
(``start_job``) or gives them back (``unplace``). Why: the simulator reports starts before the
instant's moves and power step, the live placer after its whole tick, and both must see the
same running set there (``tests/e2e/test_sim_equals_live.py`` has the workloads that told)."""

from __future__ import annotations

import dataclasses

import numpy as np

from libs.policy.config import PolicyConfig
from libs.policy.core import Scheduler
from libs.policy.inventory import demo_cluster
from libs.policy.profiles import ProfileTable
from libs.policy.types import PendingJob
from proto.jobs import JobSpec


def _sched() -> Scheduler:
    cfg = dataclasses.replace(PolicyConfig.default(), power_saving=False)
    return Scheduler(demo_cluster(), cfg=cfg, profiles=ProfileTable.default(), now=0.0)


def test_a_placement_runs_from_the_pass_and_its_confirmation_changes_nothing():
    s = _sched()
    s.queue_job(PendingJob(JobSpec(id="a", tenant="t", gpus=2, gpu_mem_gb=20), 0.0))
    (p,) = s.tick(0.0).places
    # before the driver says anything: running, out of the queue, counted for its tenant
    assert "a" not in s.queue and s.holds("a") == p.allocation
    assert "a" in s.moves.jobs and s.usage["t"][0] == 2.0
    free = s.view.gpu_free.copy()
    s.start_job("a", p.allocation, p.job.spec, 0.0)  # the driver's confirmation
    assert np.array_equal(s.view.gpu_free, free) and s.usage["t"][0] == 2.0
    s.end_job("a", 10.0)
    assert s.view.gpu_free.sum() == s.view.gpu_total.sum() and s.usage["t"][0] == 0.0


def test_a_placement_given_back_waits_again_and_holds_nothing():
    s = _sched()
    s.queue_job(PendingJob(JobSpec(id="a", tenant="t", gpus=2, gpu_mem_gb=20), 0.0))
    (p,) = s.tick(0.0).places
    s.unplace(p.allocation, 0.0)  # the commit failed
    assert "a" in s.queue and s.holds("a") is None and "a" not in s.moves.jobs
    assert s.view.gpu_free.sum() == s.view.gpu_total.sum() and s.usage["t"][0] == 0.0
    s.unplace(p.allocation, 0.0)  # twice: nothing more
    assert len(s.queue) == 1
    (again,) = s.tick(1.0).places
    assert again.job.spec.id == "a"
    # a late confirmation of the given-back placement is a start the driver found
    s.unplace(again.allocation, 1.0)
    s.start_job("a", p.allocation, p.job.spec, 1.0)
    assert "a" not in s.queue and s.holds("a") == p.allocation
