"""The gateway's read model of jobs: lifecycle events folded into ``JobView`` records.

Why a fold over the LIFECYCLE stream and not a table of its own: the stream is the one durable
record of what happened to each job (rule 4), so replaying it from the start on every restart
rebuilds exactly the same view, and the gateway owns no state that could drift from it. The model
is kept in memory, which is fine for the walking skeleton (a few hundred thousand jobs fit in a
few hundred MB); a long-lived cluster would compact terminal jobs or snapshot the fold.

Pure: no NATS, no clock. Events arrive in stream order; each rule below is idempotent, so the
gateway may also apply its own ``Submitted`` right after publishing it (to answer a duplicate
submit at once) and again when the stream delivers it.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from proto.events import (
    Cancelled,
    Checkpointed,
    Completed,
    Failed,
    LifecycleEvent,
    Placed,
    Preempted,
    Queued,
    Started,
    Submitted,
)
from proto.views import TERMINAL_STATES, JobView

_TERMINAL_STATE: dict[type, str] = {
    Completed: "completed",
    Failed: "failed",
    Cancelled: "cancelled",
}


class JobsModel:
    """Job id -> JobView, plus each job's events in the order they were applied."""

    def __init__(self) -> None:
        self._jobs: dict[str, JobView] = {}
        self._events: dict[str, list[LifecycleEvent]] = {}
        self._seen: set[tuple[str, str, float, int]] = set()
        self.orphans = 0  # events for a job whose Submitted was never seen

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    def get(self, job_id: str) -> JobView | None:
        return self._jobs.get(job_id)

    def events(self, job_id: str) -> list[LifecycleEvent]:
        return list(self._events.get(job_id, ()))

    def list(self, *, state: str | None = None, tenant: str | None = None) -> list[JobView]:
        """Jobs in submission order (oldest first), optionally filtered."""
        out = [
            j
            for j in self._jobs.values()
            if (state is None or j.state == state) and (tenant is None or j.tenant == tenant)
        ]
        out.sort(key=lambda j: (j.submit_time if j.submit_time is not None else 0.0, j.id))
        return out

    def counts(self) -> dict[str, int]:
        """Jobs per state, for the dashboard and metrics."""
        out: dict[str, int] = {}
        for j in self._jobs.values():
            out[j.state] = out.get(j.state, 0) + 1
        return out

    def apply_all(self, events: Iterable[LifecycleEvent]) -> None:
        for e in events:
            self.apply(e)

    def apply(self, event: LifecycleEvent) -> bool:
        """Fold one event in; False when it changed nothing (a repeat, an orphan, after the end)."""
        key = _event_key(event)
        if key in self._seen:
            return False
        job = self._jobs.get(event.job_id)
        if isinstance(event, Submitted):
            if job is not None:
                return False
            spec = event.spec
            self._jobs[event.job_id] = JobView(
                id=event.job_id,
                tenant=spec.tenant,
                state="pending",
                priority=spec.priority,
                gpus=spec.gpus,
                spec=spec,
                submit_time=spec.submit_time if spec.submit_time is not None else event.time,
            )
        elif job is None:
            self.orphans += 1
            return False
        elif job.state in TERMINAL_STATES:
            return False  # a job ends exactly once; anything after is noise
        else:
            _fold(job, event)
        self._seen.add(key)
        self._events.setdefault(event.job_id, []).append(event)
        return True


def _event_key(event: LifecycleEvent) -> tuple[str, str, float, int]:
    """What makes two deliveries the same event (a redelivery, or our own echo)."""
    attempt = getattr(event, "attempt", 0)
    return (event.job_id, type(event).__name__, event.time, attempt)


def _fold(job: JobView, event: LifecycleEvent) -> None:
    """The state machine: pending -> placed -> running -> one terminal state (see the module)."""
    if isinstance(event, Queued):
        job.state = "pending"
        job.reason = event.reason
        job.score = event.score
    elif isinstance(event, Placed):
        job.state = "placed"
        job.node = event.node
        job.reason = ""
        job.attempts = max(job.attempts, event.attempt)
    elif isinstance(event, Started):
        job.state = "running"
        job.node = event.node or job.node
        job.reason = ""
        job.attempts = max(job.attempts, event.attempt)
        if job.start_time is None:  # the first start: completion time counts from submit anyway
            job.start_time = event.time
    elif isinstance(event, Preempted):
        job.state = "pending"
        job.node = None
        job.reason = event.reason or "Preempted"
    elif isinstance(event, Checkpointed):
        pass  # progress is saved; the job keeps its state and node
    elif type(event) in _TERMINAL_STATE:
        job.state = _TERMINAL_STATE[type(event)]  # type: ignore[assignment]
        job.end_time = event.time
        job.node = event.node or job.node
        job.reason = event.reason


def encode_events(events: list[LifecycleEvent]) -> list[dict[str, object]]:
    """Events as plain JSON-ready dicts, with their ``type`` tag."""
    return [msgspec.to_builtins(e) for e in events]
