"""The pending set, folded from lifecycle events. Pure: no I/O, so a replay rebuilds it exactly.

A job is pending after ``Submitted`` or ``Preempted`` until it is ``Placed`` or ends. A preempted
job comes back with the next attempt number and the progress of its last checkpoint, and keeps
its original enqueue time (being preempted is not the job's fault, so it does not lose its age).

The bus is a trust boundary (rule 6): a ``Submitted`` whose spec fails
``proto.validation.revalidate_spec`` never enters the pending set, since ranking it could make
every round fail. The scorer does not end the job itself: the placer, the one writer of
refusals, publishes its ``Failed`` (see ``services.placer.tracker``), which this fold then
sees like any other end. A checkpoint's progress that is not a fraction in [0, 1] is ignored.
"""

from __future__ import annotations

from collections.abc import Callable

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
from proto.validation import FieldError, revalidate_submitted, sound_progress

OnInvalid = Callable[[Submitted, list[FieldError]], None]


class PendingSet:
    def __init__(self, on_invalid: OnInvalid | None = None) -> None:
        """``on_invalid`` hears of each refused ``Submitted`` (the service logs it)."""
        self._on_invalid = on_invalid
        self.refused = 0  # Submitted events refused by revalidate_spec
        self.pending: dict[str, PendingJob] = {}
        self._specs: dict[str, JobSpec] = {}  # live jobs only (dropped when they end)
        self._enqueued_at: dict[str, float] = {}
        self._placed_attempt: dict[str, int] = {}
        self._progress: dict[str, float] = {}
        self._terminal: set[str] = set()
        self._invalid: set[str] = set()  # jobs whose first Submitted was refused
        self._queued: dict[str, int] = {}  # job -> attempt for which Queued is already out

    def apply(self, ev: LifecycleEvent) -> bool:
        """Fold one event in; True when the pending set changed (a re-rank is due)."""
        job = ev.job_id
        if job in self._terminal:
            return False
        if isinstance(ev, Submitted):
            if job in self._specs or job in self._invalid:
                return False  # a repeated submission is the same job: the first one counts
            errors = revalidate_submitted(ev)
            if errors:
                self._invalid.add(job)  # until its Failed arrives
                self.refused += 1
                if self._on_invalid is not None:
                    self._on_invalid(ev, errors)
                return False
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
            if sound_progress(ev.progress):
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
            self._invalid.discard(job)
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
