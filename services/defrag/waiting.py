"""The defragmenter's read model: the jobs that wait, why, and when each job last moved.

Folded from the lifecycle stream. A job waits from its ``Submitted`` (or a ``Preempted``) until
its ``Placed`` or its end; the placer's ``Queued`` events carry why it waits (a job held by a
cordon or a booting node is no defragmentation's business).
A ``Checkpointed`` says the job was just moved (the protection rules' rate limit reads it).
Pure: fed events, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from libs.policy.decisions import CORDONED, NODE_WAKING
from libs.policy.types import PendingJob
from proto.events import (
    Checkpointed,
    LifecycleEvent,
    Placed,
    Preempted,
    Queued,
    Submitted,
    is_terminal,
)
from proto.jobs import JobSpec
from proto.validation import revalidate_submitted


@dataclass(slots=True)
class Waiting:
    spec: JobSpec
    since: float  # its place in line (submit time)
    reason: str = ""


class WaitingJobs:
    def __init__(self) -> None:
        self.jobs: dict[str, Waiting] = {}
        self.specs: dict[str, JobSpec] = {}  # live jobs, waiting or not
        self.moved_at: dict[str, float] = {}

    def apply(self, ev: LifecycleEvent) -> None:
        job = ev.job_id
        if isinstance(ev, Submitted):
            if not revalidate_submitted(ev) and job not in self.specs:
                self.specs[job] = ev.spec
                self.jobs[job] = Waiting(ev.spec, ev.spec.submit_time or ev.time)
        elif isinstance(ev, Queued):
            w = self.jobs.get(job)
            if w is not None and ev.reason:
                w.reason = ev.reason
        elif isinstance(ev, Placed):
            self.jobs.pop(job, None)
        elif isinstance(ev, Preempted):
            spec = self.specs.get(job)
            if spec is not None:
                self.jobs[job] = Waiting(spec, spec.submit_time or ev.time)
        elif isinstance(ev, Checkpointed):
            if math.isfinite(ev.time):
                self.moved_at[job] = ev.time
        elif is_terminal(ev):
            self.jobs.pop(job, None)
            self.specs.pop(job, None)
            self.moved_at.pop(job, None)

    def blocked(self, limit: int) -> list[PendingJob]:
        """Up to ``limit`` waiting jobs, highest priority then longest wait, except those held
        by a cordon or a booting node (moving jobs would not help them). Whether one is blocked
        by fragments is the plan's to say (``plan_moves`` skips a job that fits now): a job the
        placer never tried (a full cluster) still says Priority."""
        rows = [w for w in self.jobs.values() if w.reason not in (CORDONED, NODE_WAKING)]
        rows.sort(key=lambda w: (-w.spec.priority, w.since, w.spec.id))
        return [PendingJob(w.spec, w.since) for w in rows[:limit]]
