"""The pending set, folded from lifecycle events. Pure: no I/O, so a replay rebuilds it exactly.

A job is pending after ``Submitted`` or ``Preempted`` until it is ``Placed`` or ends. A preempted
job comes back with the next attempt number and the progress of its last checkpoint, and keeps
its original enqueue time (being preempted is not the job's fault, so it does not lose its age).
"""

from __future__ import annotations

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


class PendingSet:
    def __init__(self) -> None:
        self.pending: dict[str, PendingJob] = {}
        self._specs: dict[str, JobSpec] = {}  # live jobs only (dropped when they end)
        self._enqueued_at: dict[str, float] = {}
        self._placed_attempt: dict[str, int] = {}
        self._progress: dict[str, float] = {}
        self._terminal: set[str] = set()
        self._queued: dict[str, int] = {}  # job -> attempt for which Queued is already out

    def apply(self, ev: LifecycleEvent) -> bool:
        """Fold one event in; True when the pending set changed (a re-rank is due)."""
        job = ev.job_id
        if job in self._terminal:
            return False
        if isinstance(ev, Submitted):
            if job in self._specs:
                return False  # a repeated submission is the same job
            self._specs[job] = ev.spec
            self._enqueued_at[job] = ev.spec.submit_time or ev.time
            if job not in self._placed_attempt:
                self.pending[job] = PendingJob(ev.spec, self._enqueued_at[job], attempt=1)
                return True
            return False
        if isinstance(ev, Queued):
            p = self.pending.get(job)
            if p is not None:
                self._queued[job] = p.attempt
            return False
        if isinstance(ev, Placed):
            self._placed_attempt[job] = max(ev.attempt, self._placed_attempt.get(job, 0))
            return self.pending.pop(job, None) is not None
        if isinstance(ev, Checkpointed):
            self._progress[job] = ev.progress
            return False
        if isinstance(ev, Preempted):
            spec = self._specs.get(job)
            if spec is None or job in self.pending:
                return False
            self.pending[job] = PendingJob(
                spec,
                self._enqueued_at.get(job, ev.time),
                attempt=self._placed_attempt.get(job, 0) + 1,
                progress=self._progress.get(job, 0.0),
            )
            return True
        if is_terminal(ev):
            self._terminal.add(job)
            for d in (self._specs, self._enqueued_at, self._placed_attempt, self._progress):
                d.pop(job, None)
            self._queued.pop(job, None)
            return self.pending.pop(job, None) is not None
        return False

    def needs_queued_event(self, job_id: str) -> bool:
        """True when the job's current attempt has not had its ``Queued`` event yet."""
        p = self.pending.get(job_id)
        return p is not None and self._queued.get(job_id) != p.attempt

    def mark_queued(self, job_id: str) -> None:
        p = self.pending.get(job_id)
        if p is not None:
            self._queued[job_id] = p.attempt

    def is_terminal(self, job_id: str) -> bool:
        return job_id in self._terminal

    def __len__(self) -> int:
        return len(self.pending)
