"""The gateway's read model of jobs: lifecycle events folded into ``JobView`` records.

Why a fold over the LIFECYCLE stream and not a table of its own: the stream is the one durable
record of what happened to each job (rule 4), so the fold rebuilds exactly the same view, and the
gateway owns no state that could drift from it. Why bounded: a long-lived cluster runs millions of
jobs, and LIFECYCLE itself has a retention limit. So the model keeps, per job, its view and only
its newest ``keep_events`` events (the Submitted one always; the stream has the rest while it
lasts), and forgets a finished job ``retention_s`` after it saw the job end, or once more than
``max_finished`` finished jobs are held (oldest first). Retention counts from when the model saw
the end (the "now" of ``expire``), not from the event's own time, so a skewed or forged event time
can neither expire a job at once nor pin it forever; after a full replay it counts afresh. A
forgotten job answers 404 like an unknown one, and its id may be submitted again. The model
encodes itself (``encode``/``load``, a versioned msgspec Struct) so that the gateway restarts
from a snapshot (``libs.bus.snapshot``) instead of replaying the whole stream.

Pure: no NATS, no clock (``expire`` takes "now"). Events arrive in stream order; each rule below
is idempotent, so the gateway may also apply its own ``Submitted`` right after publishing it (to
answer a duplicate submit at once) and again when the stream delivers it, and a restart from a
snapshot may replay a few events the snapshot already holds.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Iterable

import msgspec

from libs.policy.stages.shrink import fold_resize
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

SNAPSHOT_VERSION = 1  # bump when JobsSnapshot or _Stored change shape: old snapshots are ignored
DEFAULT_KEEP_EVENTS = 16  # events kept per job in memory (Submitted + the newest 15)
DEFAULT_RETENTION_S = 86_400.0  # a finished job is forgotten a day (Mosaic clock) after its end
DEFAULT_MAX_FINISHED = 100_000  # ... or when this many newer finished jobs are held


class _Entry(msgspec.Struct, array_like=True, gc=False):
    """One job: its view, its Submitted (whose spec the view shares) and its newest events."""

    view: JobView
    submitted: Submitted
    events: list[LifecycleEvent]  # after ``submitted``, oldest first, at most keep_events - 1
    dropped: int = 0  # events folded in but no longer kept

    def has(self, key: tuple[str, float, int]) -> bool:
        return any(_event_key(e) == key for e in self.events)


class _Stored(msgspec.Struct, array_like=True, gc=False):
    """An ``_Entry`` in a snapshot: the Submitted event without its spec, which the view holds
    (the spec is the biggest part of a job; stored once, the snapshot is ~30% smaller)."""

    view: JobView
    submitted_time: float
    submitted_node: str | None
    submitted_reason: str
    events: list[LifecycleEvent]
    dropped: int
    submitted_trace: str = ""  # the job's traceparent (absent from snapshots before issue 13)

    @classmethod
    def of(cls, e: _Entry) -> _Stored:
        sub = e.submitted
        return cls(e.view, sub.time, sub.node, sub.reason, e.events, e.dropped, sub.trace)

    def entry(self) -> _Entry:
        view = self.view
        sub = Submitted(
            job_id=view.id,
            time=self.submitted_time,
            node=self.submitted_node,
            reason=self.submitted_reason,
            spec=view.spec,
            trace=self.submitted_trace,
        )
        return _Entry(view=view, submitted=sub, events=self.events, dropped=self.dropped)


class JobsSnapshot(msgspec.Struct, kw_only=True):
    """The model as stored in a snapshot: jobs in submission order, finished ones by end."""

    version: int
    jobs: list[_Stored]
    finished: list[tuple[str, float]]  # (job id, when it was seen ending), in that order
    now: float = 0.0
    orphans: int = 0
    expired: int = 0


class _Version(msgspec.Struct):
    version: int


class JobsModel:
    """Job id -> JobView, plus each job's newest events in the order they were applied."""

    def __init__(
        self,
        *,
        keep_events: int = DEFAULT_KEEP_EVENTS,
        retention_s: float = DEFAULT_RETENTION_S,
        max_finished: int = DEFAULT_MAX_FINISHED,
    ) -> None:
        if keep_events < 2 or retention_s < 0 or max_finished < 0:
            raise ValueError("keep_events >= 2, retention_s >= 0 and max_finished >= 0")
        self.keep_events = keep_events
        self.retention_s = retention_s
        self.max_finished = max_finished
        self._jobs: dict[str, _Entry] = {}
        self._finished: dict[str, float] = {}  # terminal job -> "now" when it ended, in order
        self._now = 0.0  # the latest "now" given to ``expire``
        self.orphans = 0  # events for a job whose Submitted was never seen (or is forgotten)
        self.expired = 0  # finished jobs forgotten so far
        self.on_expire: Callable[[str], None] | None = None  # told each forgotten job id

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    def get(self, job_id: str) -> JobView | None:
        entry = self._jobs.get(job_id)
        return entry.view if entry is not None else None

    def trace_of(self, job_id: str) -> str:
        """The job's traceparent (its ``Submitted.trace``), "" when unknown or untraced."""
        entry = self._jobs.get(job_id)
        return entry.submitted.trace if entry is not None else ""

    def events(self, job_id: str) -> list[LifecycleEvent]:
        """The Submitted event and the newest ones after it (``keep_events`` at most)."""
        entry = self._jobs.get(job_id)
        return [] if entry is None else [entry.submitted, *entry.events]

    def list(self, *, state: str | None = None, tenant: str | None = None) -> list[JobView]:
        """Jobs in submission order (oldest first), optionally filtered."""
        out = [
            e.view
            for e in self._jobs.values()
            if (state is None or e.view.state == state)
            and (tenant is None or e.view.tenant == tenant)
        ]
        out.sort(key=lambda j: (j.submit_time if j.submit_time is not None else 0.0, j.id))
        return out

    def counts(self) -> dict[str, int]:
        """Jobs per state, for the dashboard and metrics."""
        out: dict[str, int] = {}
        for e in self._jobs.values():
            out[e.view.state] = out.get(e.view.state, 0) + 1
        return out

    def apply_all(self, events: Iterable[LifecycleEvent]) -> None:
        for e in events:
            self.apply(e)

    def apply(self, event: LifecycleEvent) -> bool:
        """Fold one event in; False when it changed nothing (a repeat, an orphan, after the end)."""
        entry = self._jobs.get(event.job_id)
        if isinstance(event, Submitted):
            if entry is not None:
                return False
            spec = event.spec
            view = JobView(
                id=event.job_id,
                tenant=spec.tenant,
                state="pending",
                priority=spec.priority,
                gpus=spec.gpus,
                spec=spec,
                submit_time=spec.submit_time if spec.submit_time is not None else event.time,
            )
            self._jobs[event.job_id] = _Entry(view=view, submitted=event, events=[])
            return True
        if entry is None:
            self.orphans += 1
            return False
        if entry.view.state in TERMINAL_STATES:
            return False  # a job ends exactly once; anything after is noise
        if entry.has(_event_key(event)):
            return False
        event = _compact(event, entry.view.id)
        _fold(entry.view, event)
        if len(entry.events) >= self.keep_events - 1:
            del entry.events[0]
            entry.dropped += 1
        entry.events.append(event)
        if entry.view.state in TERMINAL_STATES:
            self._finished[event.job_id] = self._now
            while len(self._finished) > self.max_finished:
                self._forget(next(iter(self._finished)))
        return True

    def expire(self, now: float) -> int:
        """Forget finished jobs seen ending before ``now - retention_s``; how many were. ``now``
        is also when jobs that end from here on are taken to have ended (it never goes back)."""
        self._now = max(self._now, now)
        cutoff = self._now - self.retention_s
        n = 0
        while self._finished:
            job_id, ended = next(iter(self._finished.items()))
            if ended >= cutoff:
                break
            self._forget(job_id)
            n += 1
        return n

    def _forget(self, job_id: str) -> None:
        del self._finished[job_id]
        del self._jobs[job_id]
        self.expired += 1
        if self.on_expire is not None:
            self.on_expire(job_id)

    # --- snapshots ---------------------------------------------------------------------------

    def encode(self) -> bytes:
        """The whole model as msgpack bytes (``JobsSnapshot``)."""
        snap = JobsSnapshot(
            version=SNAPSHOT_VERSION,
            jobs=[_Stored.of(e) for e in self._jobs.values()],
            finished=list(self._finished.items()),
            now=self._now,
            orphans=self.orphans,
            expired=self.expired,
        )
        return msgspec.msgpack.encode(snap)

    def load(self, data: bytes) -> JobsModel:
        """Replace this model's content by a snapshot's (keeping its limits); raises
        ``ValueError`` or a msgspec error for a snapshot of another version or a corrupt one."""
        version = msgspec.msgpack.decode(data, type=_Version).version
        if version != SNAPSHOT_VERSION:
            raise ValueError(
                f"jobs snapshot version {version}, this build reads {SNAPSHOT_VERSION}"
            )
        # a snapshot is millions of small objects: the cyclic GC would run hundreds of times
        # during the decode for nothing (it holds no cycles) - 100k jobs load in 0.8 s, not 2.5 s
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            snap = msgspec.msgpack.decode(data, type=JobsSnapshot)
        finally:
            if was_enabled:
                gc.enable()
        jobs: dict[str, _Entry] = {}
        for stored in snap.jobs:
            entry = stored.entry()
            for event in entry.events:  # shared strings, as after a fold
                _compact(event, entry.view.id)
            if entry.view.node is not None:
                entry.view.node = sys.intern(entry.view.node)
            jobs[entry.view.id] = entry
        missing = [j for j, _ in snap.finished if j not in jobs]
        if missing:
            raise ValueError(f"jobs snapshot lists {len(missing)} finished jobs it does not hold")
        self._jobs = jobs
        self._finished = dict(snap.finished)
        self._now = max(self._now, snap.now)
        self.orphans, self.expired = snap.orphans, snap.expired
        return self


def _event_key(event: LifecycleEvent) -> tuple[str, float, int, str]:
    """What makes two deliveries of one job's event the same event (a redelivery, a replay).
    The reason too: the scorer's ``Queued`` and the placer's may carry the same time (a stepped
    clock), and the one is no repeat of the other."""
    return (type(event).__name__, event.time, getattr(event, "attempt", 0), event.reason)


def _compact(event: LifecycleEvent, job_id: str) -> LifecycleEvent:
    """The event sharing its strings with the rest of the model: the job's one id string and
    one string per node name, instead of a fresh copy per decoded event (~120 bytes each)."""
    msgspec.structs.force_setattr(event, "job_id", job_id)
    if event.node is not None:
        msgspec.structs.force_setattr(event, "node", sys.intern(event.node))
    return event


def _fold(job: JobView, event: LifecycleEvent) -> None:
    """The state machine: pending -> placed -> running -> one terminal state (see the module)."""
    if isinstance(event, Queued):
        _fold_queued(job, event)
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
        # an elastic resize (a shrink, or a grow back, stages.grow): it waits (and runs next)
        # on that many GPUs; folded only for the job's latest attempt, so a replayed earlier
        # event does not undo a later resize (sizes are not monotone)
        if event.resize_gpus and (not event.attempt or event.attempt >= job.attempts):
            now_spec = msgspec.structs.replace(job.spec, gpus=job.gpus)
            job.gpus = fold_resize(now_spec, event.resize_gpus).gpus
    elif isinstance(event, Checkpointed):
        pass  # progress is saved; the job keeps its state and node
    elif type(event) in _TERMINAL_STATE:
        job.state = _TERMINAL_STATE[type(event)]  # type: ignore[assignment]
        job.end_time = event.time
        job.node = event.node or job.node
        job.reason = event.reason


def _fold_queued(job: JobView, event: Queued) -> None:
    """Two services publish ``Queued``: the scorer once per attempt, with the admission score
    and no reason, and the placer with its reason to wait and the current score whenever the
    reason changes. Each says only what it knows: no reason keeps the reason the placer gave,
    no score keeps the score. Neither moves the job's state: ``Submitted`` and ``Preempted``
    make it pending, and a ``Queued`` that reaches a placed or running job was decided before
    the placement (the scorer announces while the placer places, unordered), so it is news of
    an earlier moment and changes nothing but the score (its reason is stale)."""
    if event.score is not None:
        job.score = event.score
    if event.reason and job.state == "pending":
        job.reason = event.reason


def encode_events(events: list[LifecycleEvent]) -> list[dict[str, object]]:
    """Events as plain JSON-ready dicts, with their ``type`` tag."""
    return [msgspec.to_builtins(e) for e in events]
