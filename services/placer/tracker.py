"""What the placer must know about each job, folded from lifecycle events. Pure (no I/O).

Why the placer keeps its own: it must never place a job after it ended nor twice, and after a
crash it must know which committed allocations never reached their executor (no ``Started``) so
it can resend the run command. A replay of the stream rebuilds all of it.

The bus is a trust boundary (rule 6). A ``Submitted`` whose spec fails
``proto.validation.revalidate_submitted`` (``gpus`` -1 published straight onto NATS) is kept
apart in ``invalid``, never in ``specs``, and the active placer refuses it with a ``Failed``
event carrying the reasons (``invalid_jobs``). Why ``Failed`` and not only a dead letter: the
event is already in LIFECYCLE and the gateway shows the job as pending; a dead letter would
leave it pending forever, while ``Failed`` from the one writer of refusals (under the lease,
``Nats-Msg-Id`` ``failed-<job>``) gives it exactly one terminal state that says why. As
everywhere in the fold, the first ``Submitted`` of a job counts.
"""

from __future__ import annotations

import msgspec

from proto.events import (
    Checkpointed,
    LifecycleEvent,
    Placed,
    Preempted,
    Started,
    Submitted,
    event_type,
    is_terminal,
)
from proto.jobs import JobSpec
from proto.validation import FieldError, revalidate_submitted, sound_id, sound_progress


class JobTracker:
    def __init__(self) -> None:
        self.specs: dict[str, JobSpec] = {}
        self.terminal: dict[str, str] = {}  # job -> "completed" | "failed" | "cancelled"
        self.placed: dict[str, int] = {}  # job -> highest attempt with a Placed event
        self.started: dict[str, int] = {}  # job -> highest attempt with a Started event
        self.freed_attempt: dict[str, int] = {}  # job -> highest attempt that a Preempted ended
        self.progress: dict[str, float] = {}
        self.invalid: dict[str, tuple[JobSpec, list[FieldError]]] = {}  # until it ends
        self.unaddressable = 0  # unsound Submitted events whose job id is no id at all
        self.events_seen = 0

    def apply(self, ev: LifecycleEvent) -> None:
        self.events_seen += 1
        job = ev.job_id
        if isinstance(ev, Submitted):
            if job in self.specs or job in self.invalid:
                return
            errors = revalidate_submitted(ev)
            if not errors:
                self.specs[job] = ev.spec
            elif not sound_id(job):
                self.unaddressable += 1  # no subject to answer on: the bus dead-letters such
            elif job not in self.terminal:
                spec = ev.spec if ev.spec.id == job else msgspec.structs.replace(ev.spec, id=job)
                self.invalid[job] = (spec, errors)
        elif isinstance(ev, Placed):
            self.placed[job] = max(ev.attempt, self.placed.get(job, 0))
        elif isinstance(ev, Started):
            self.started[job] = max(ev.attempt, self.started.get(job, 0))
        elif isinstance(ev, Checkpointed):
            if sound_progress(ev.progress):
                self.progress[job] = ev.progress
        elif isinstance(ev, Preempted):
            self.freed_attempt[job] = self.placed.get(job, 0)
        elif is_terminal(ev):
            self.terminal.setdefault(job, event_type(ev))
            self.invalid.pop(job, None)

    def invalid_jobs(self) -> list[tuple[JobSpec, list[FieldError]]]:
        """Jobs whose ``Submitted`` was unsound and that have not ended yet: to refuse. Each
        spec carries the event's job id (the one to answer on), whatever its own said."""
        return list(self.invalid.values())

    def is_terminal(self, job_id: str) -> bool:
        return job_id in self.terminal

    def next_attempt(self, job_id: str) -> int:
        """The attempt number the job's next placement gets (1 for a fresh job)."""
        return self.placed.get(job_id, 0) + 1

    def placed_seen(self, job_id: str, attempt: int) -> bool:
        return self.placed.get(job_id, 0) >= attempt

    def started_seen(self, job_id: str, attempt: int) -> bool:
        return self.started.get(job_id, 0) >= attempt

    def holds_nothing(self, job_id: str, attempt: int) -> bool:
        """True when an allocation of ``attempt`` is stale: the job ended, or that attempt was
        preempted (its resources are free again)."""
        return job_id in self.terminal or self.freed_attempt.get(job_id, 0) >= attempt

    def note_placed(self, job_id: str, attempt: int) -> None:
        """Record our own placement before its event comes back from the stream."""
        self.placed[job_id] = max(attempt, self.placed.get(job_id, 0))
