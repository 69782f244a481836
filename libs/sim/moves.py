"""Moving jobs in the simulator: a checkpoint that costs time, then a requeue with progress.

The simulator's side of ``libs.policy.stages.preempt`` (the live side is the placer's
checkpoint command and the executor's ``Checkpointed`` + ``Preempted``). A policy that moves
jobs has ``move_step(now) -> [(job, kind, reason, shrink_to)]``; the engine calls it after each
woken instant's pass, as the live placer's ``Scheduler.tick`` does. Each move:

1. the job stops computing at once (its progress is frozen: the work done by now, as a share of
   the whole job's runtime on the attempt's GPUs) and keeps its GPUs for ``checkpoint_cost_s``
   while its state is saved (the same cost for every policy compared);
2. then its resources are released, its GPU time and energy accounted like any attempt's end,
   and it is queued again with its progress; the next attempt runs only the rest;
3. the delay from the requeue to the next start is the resume delay (``resume_delays_s``);
4. a resize (``shrink_to`` > 0, an elastic job: a shrink, ``libs.policy.stages.shrink``, or a
   grow back when larger than it holds, ``libs.policy.stages.grow``) requeues the job
   resized: ``shrink_to`` GPUs, its true runtimes scaled by the same rule as its estimate.

A move of a job that is neither checkpointable nor elastic is refused here and counted in
``SimResult.preempted_non_checkpointable``: the engine checks the policy, not the reverse.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from libs.policy.stages.shrink import resized, resized_runtime_s
from libs.sim.state import RUNNING, SimJob

SimMove = tuple[SimJob, str, str, int]  # (job, kind, reason, shrink_to: 0 = same size)
MAX_PROGRESS = 0.999  # a moved job always has some work left (so it runs again)


class Mover:
    def __init__(self, push: Callable[[float, int, int, int], None], kind: int, cost_s: float):
        self._push = push
        self._kind = kind
        self.cost_s = cost_s
        self.refused_non_checkpointable = 0

    def apply(self, orders: list[SimMove], t: float) -> None:
        for job, kind, _reason, shrink_to in orders:
            if job.state != RUNNING or job.ckpt_start_s >= 0:
                raise AssertionError(f"move of {job.spec.id}: not running, or moving already")
            if not (job.spec.checkpointable or job.spec.elastic is not None):
                self.refused_non_checkpointable += 1
                continue
            if shrink_to:
                resized(job.spec, shrink_to)  # refuses a size the job may not take, now
            job.ckpt_start_s = t
            job.ckpt_kind = kind
            job.ckpt_shrink_to = shrink_to
            job.token += 1  # its finish event is stale: it stopped computing
            self._push(t + self.cost_s, self._kind, job.idx, job.token)

    def checkpointed(self, job: SimJob) -> None:
        """The checkpoint is saved: freeze the progress it kept (before the attempt's stop)."""
        done_s = job.ckpt_start_s - job.start_s
        if job.attempt_full_s > 0:
            job.progress = min(MAX_PROGRESS, job.progress + done_s / job.attempt_full_s)
        job.moves += 1
        job.migrations += job.ckpt_kind == "migrate"
        job.ckpt_start_s = -1.0

    @staticmethod
    def resize(job: SimJob) -> None:
        """After the attempt's stop: a resized job (shrunk, or grown back) waits again at its
        new size."""
        k, job.ckpt_shrink_to = job.ckpt_shrink_to, 0
        if k:
            held = job.spec.gpus
            job.spec = resized(job.spec, k)
            job.runtime_s = np.asarray(resized_runtime_s(job.runtime_s, held, k), dtype=float)
            if k < held:
                job.shrinks += 1
            else:
                job.grows += 1

    @staticmethod
    def started(job: SimJob, t: float) -> None:
        if job.preempted_at_s >= 0:
            job.resume_delays_s.append(t - job.preempted_at_s)
            job.preempted_at_s = -1.0
