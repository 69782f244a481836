"""What the placer must know about each job, folded from lifecycle events. Pure (no I/O).

Why the placer keeps its own: it must never place a job after it ended nor twice, and after a
crash it must know which committed allocations never reached their executor (no ``Started``) so
it can resend the run command. A replay of the stream rebuilds all of it.
"""

from __future__ import annotations

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


class JobTracker:
    def __init__(self) -> None:
        self.specs: dict[str, JobSpec] = {}
        self.terminal: dict[str, str] = {}  # job -> "completed" | "failed" | "cancelled"
        self.placed: dict[str, int] = {}  # job -> highest attempt with a Placed event
        self.started: dict[str, int] = {}  # job -> highest attempt with a Started event
        self.freed_attempt: dict[str, int] = {}  # job -> highest attempt that a Preempted ended
        self.progress: dict[str, float] = {}
        self.events_seen = 0

    def apply(self, ev: LifecycleEvent) -> None:
        self.events_seen += 1
        job = ev.job_id
        if isinstance(ev, Submitted):
            self.specs.setdefault(job, ev.spec)
        elif isinstance(ev, Placed):
            self.placed[job] = max(ev.attempt, self.placed.get(job, 0))
        elif isinstance(ev, Started):
            self.started[job] = max(ev.attempt, self.started.get(job, 0))
        elif isinstance(ev, Checkpointed):
            self.progress[job] = ev.progress
        elif isinstance(ev, Preempted):
            self.freed_attempt[job] = self.placed.get(job, 0)
        elif is_terminal(ev):
            self.terminal.setdefault(job, event_type(ev))

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
