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

Snapshots (``encode``/``load``, ``services.placer.snapshot``): the placer restarts from the
tracker as saved plus the events after the snapshot's sequence (the consumer's ack floor), so a
few events it holds already are applied again. Each rule is idempotent under such a replay:
attempts only grow (``max``), ``Preempted`` frees the attempt it names (a replayed one after the
next ``Placed`` would otherwise free the running attempt, and the placer would give its GPUs
away), and an ended job ignores every later event, its ``Submitted`` included. The placer's own
placements (``note_placed``) are kept apart from the ``Placed`` events seen and never saved: a
snapshot taken between a commit and its ``Placed`` must not make a restart believe the event is
out (takeover resends it when the stream lacks it).

Bounded: an ended job keeps only its terminal state, and is forgotten ``keep_terminal_events``
lifecycle events after its end. What forgetting costs: ``is_terminal`` is how the placer refuses
stale work, so a forgotten job whose ``Submitted`` came back would be placed again. It cannot come
back through a restart: a replay repeats only the events after the last snapshot, which is at
most the snapshot cadence in events (MOSAIC_SNAPSHOT_EVERY_EVENTS, 10,000) behind, and the job's
``Submitted`` is older than its end; a full replay repeats its end too. Why events and not time:
that bound is in events, whatever the clock does. A forgotten id that is submitted anew (the
gateway forgets finished jobs after a day) is a new job, as it is for the gateway.
"""

from __future__ import annotations

import math

import msgspec

from libs.obs.jobspans import clean_traceparent
from libs.policy.stages.shrink import fold_resize
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

SNAPSHOT_VERSION = 1  # bump when TrackerSnapshot changes shape: older snapshots are then ignored
DEFAULT_KEEP_TERMINAL_EVENTS = 500_000  # an ended job is forgotten this many events after its end


class TrackerSnapshot(msgspec.Struct, kw_only=True):
    """The tracker as stored in a snapshot (``JobTracker.encode``)."""

    version: int
    events_seen: int
    unaddressable: int
    specs: dict[str, JobSpec]
    terminal: list[tuple[str, str, int]]  # (job, its end, events_seen at the end), oldest first
    placed: dict[str, int]
    started: dict[str, int]
    freed_attempt: dict[str, int]
    progress: dict[str, float]
    invalid: dict[str, tuple[JobSpec, list[FieldError]]]
    enqueued_at: dict[str, float] = {}
    traces: dict[str, str] = {}  # live jobs' traceparents (absent before issue 13: none)
    moved_at: dict[str, float] = {}  # checkpointed jobs' last checkpoint (issue 14)


class _Version(msgspec.Struct):
    version: int


class JobTracker:
    def __init__(self, *, keep_terminal_events: int = DEFAULT_KEEP_TERMINAL_EVENTS) -> None:
        if keep_terminal_events < 1:
            raise ValueError(f"keep_terminal_events must be >= 1, got {keep_terminal_events}")
        self.keep_terminal_events = keep_terminal_events
        self.specs: dict[str, JobSpec] = {}  # live jobs
        self.terminal: dict[str, str] = {}  # job -> "completed" | "failed" | "cancelled"
        self._ended_at: dict[str, int] = {}  # job -> events_seen at its end, oldest first
        self.noted: dict[str, int] = {}  # job -> highest attempt this process placed (unsaved)
        self.placed: dict[str, int] = {}  # job -> highest attempt with a Placed event
        self.started: dict[str, int] = {}  # job -> highest attempt with a Started event
        self.freed_attempt: dict[str, int] = {}  # job -> highest attempt that a Preempted ended
        self.progress: dict[str, float] = {}
        # job -> time of its last checkpoint (a move): its resume deadline counts from there
        self.moved_at: dict[str, float] = {}
        self.enqueued_at: dict[str, float] = {}  # job -> its place in line (submit time)
        self.invalid: dict[str, tuple[JobSpec, list[FieldError]]] = {}  # until it ends
        self.traces: dict[str, str] = {}  # live job -> its trace (Submitted.trace, cleaned)
        self.unaddressable = 0  # unsound Submitted events whose job id is no id at all
        self.events_seen = 0
        self.changed: set[str] = set()  # jobs an event touched since the scheduler looked

    def apply(self, ev: LifecycleEvent) -> None:
        self.events_seen += 1
        self._expire()
        job = ev.job_id
        self.changed.add(job)
        if job in self.terminal:
            return  # a job ends once; anything after (a replay, a late duplicate) is noise
        if isinstance(ev, Submitted):
            if job in self.specs or job in self.invalid:
                return
            errors = revalidate_submitted(ev)
            if (trace := clean_traceparent(ev.trace)) and sound_id(job):
                self.traces[job] = trace  # a refusal joins the job's trace too
            if not errors:
                self.specs[job] = ev.spec
                self.enqueued_at[job] = ev.spec.submit_time or ev.time
            elif not sound_id(job):
                self.unaddressable += 1  # no subject to answer on: the bus dead-letters such
            else:
                spec = ev.spec if ev.spec.id == job else msgspec.structs.replace(ev.spec, id=job)
                self.invalid[job] = (spec, errors)
        elif isinstance(ev, Placed):
            self.placed[job] = max(ev.attempt, self.placed.get(job, 0))
        elif isinstance(ev, Started):
            self.started[job] = max(ev.attempt, self.started.get(job, 0))
        elif isinstance(ev, Checkpointed):
            if sound_progress(ev.progress):
                self.progress[job] = ev.progress
            if math.isfinite(ev.time):
                self.moved_at[job] = ev.time
        elif isinstance(ev, Preempted):
            freed = ev.attempt or self.placed.get(job, 0)  # 0: an event that names no attempt
            # an elastic resize (a shrink, or a grow back): it waits resized, folded once per
            # attempt, so a replayed earlier event does not undo a later resize (sizes are not
            # monotone since jobs grow back, stages.grow)
            fresh = not ev.attempt or ev.attempt > self.freed_attempt.get(job, 0)
            if ev.resize_gpus and job in self.specs and fresh:
                self.specs[job] = fold_resize(self.specs[job], ev.resize_gpus)
            self.freed_attempt[job] = max(freed, self.freed_attempt.get(job, 0))
        elif is_terminal(ev):
            self.terminal[job] = event_type(ev)
            self._ended_at[job] = self.events_seen
            for d in (
                self.specs,
                self.placed,
                self.started,
                self.freed_attempt,
                self.progress,
                self.enqueued_at,
                self.moved_at,
            ):
                d.pop(job, None)
            self.traces.pop(job, None)
            self.noted.pop(job, None)
            self.invalid.pop(job, None)

    def _expire(self) -> None:
        """Forget ended jobs whose end is more than ``keep_terminal_events`` events old."""
        cutoff = self.events_seen - self.keep_terminal_events
        while self._ended_at:
            job, ended = next(iter(self._ended_at.items()))
            if ended > cutoff:
                return
            del self._ended_at[job]
            del self.terminal[job]

    def known(self, job_id: str) -> bool:
        """The job's ``Submitted`` (sound) was seen, or its end (and it is not forgotten)."""
        return job_id in self.specs or job_id in self.terminal

    def invalid_jobs(self) -> list[tuple[JobSpec, list[FieldError]]]:
        """Jobs whose ``Submitted`` was unsound and that have not ended yet: to refuse. Each
        spec carries the event's job id (the one to answer on), whatever its own said."""
        return list(self.invalid.values())

    def is_terminal(self, job_id: str) -> bool:
        return job_id in self.terminal

    def trace_of(self, job_id: str) -> str:
        """The job's traceparent ("" when none): the parent of the placer's decision spans."""
        return self.traces.get(job_id, "")

    def next_attempt(self, job_id: str) -> int:
        """The attempt number the job's next placement gets (1 for a fresh job)."""
        return max(self.placed.get(job_id, 0), self.noted.get(job_id, 0)) + 1

    def placed_seen(self, job_id: str, attempt: int) -> bool:
        """True when the stream holds this attempt's ``Placed`` (our own commits aside)."""
        return self.placed.get(job_id, 0) >= attempt

    def started_seen(self, job_id: str, attempt: int) -> bool:
        return self.started.get(job_id, 0) >= attempt

    def holds_nothing(self, job_id: str, attempt: int) -> bool:
        """True when an allocation of ``attempt`` is stale: the job ended, or that attempt was
        preempted (its resources are free again)."""
        return job_id in self.terminal or self.freed_attempt.get(job_id, 0) >= attempt

    def note_placed(self, job_id: str, attempt: int) -> None:
        """Record our own placement before its event comes back from the stream (so the next
        attempt number is right); kept out of ``placed`` and of snapshots (see the module)."""
        self.noted[job_id] = max(attempt, self.noted.get(job_id, 0))

    # --- snapshots ---------------------------------------------------------------------------

    def encode(self) -> bytes:
        """What the lifecycle told the tracker, as msgpack bytes (``TrackerSnapshot``)."""
        return msgspec.msgpack.encode(
            TrackerSnapshot(
                version=SNAPSHOT_VERSION,
                events_seen=self.events_seen,
                unaddressable=self.unaddressable,
                specs=self.specs,
                terminal=[(j, self.terminal[j], n) for j, n in self._ended_at.items()],
                placed=self.placed,
                started=self.started,
                freed_attempt=self.freed_attempt,
                progress=self.progress,
                moved_at=self.moved_at,
                invalid=self.invalid,
                enqueued_at=self.enqueued_at,
                traces=self.traces,
            )
        )

    def load(self, data: bytes) -> JobTracker:
        """Replace the content by a snapshot's (keeping the retention); raises ``ValueError`` or
        a msgspec error for a snapshot of another version or a corrupt one."""
        version = msgspec.msgpack.decode(data, type=_Version).version
        if version != SNAPSHOT_VERSION:
            raise ValueError(f"tracker snapshot version {version}, expected {SNAPSHOT_VERSION}")
        snap = msgspec.msgpack.decode(data, type=TrackerSnapshot)
        self.events_seen, self.unaddressable = snap.events_seen, snap.unaddressable
        self.specs = snap.specs
        self.terminal = {j: end for j, end, _ in snap.terminal}
        self._ended_at = {j: n for j, _, n in snap.terminal}
        self.placed, self.started = snap.placed, snap.started
        self.freed_attempt, self.progress = snap.freed_attempt, snap.progress
        self.invalid = snap.invalid
        self.moved_at = snap.moved_at
        # a snapshot from before enqueued_at was kept: the submit time the spec carries
        known = snap.enqueued_at
        self.enqueued_at = {j: known.get(j, s.submit_time or 0.0) for j, s in self.specs.items()}
        self.traces = snap.traces
        self.noted = {}
        return self
