"""The pending set, folded from lifecycle events. Pure: no I/O, so a replay rebuilds it exactly.

What the scorer needs it for: which attempts still want their admission score
(``unannounced``), each job's trace, and the queue's length for the gauge. A ``Queued`` without
a reason is the scorer's own and marks its attempt as announced, so a restart that replays the
stream announces nothing twice; the placer's ``Queued`` (with a reason to wait) do not count.
An attempt the placer placed before the scorer got to it still wants its score: the placer no
longer waits for the scorer, and every attempt's trace has one ``scorer.score`` span. The order
of the queue is not kept here: the placer's scheduler decides it (``service``).

A job is pending after ``Submitted`` or ``Preempted`` until it is ``Placed`` or ends. A preempted
job comes back with the next attempt number and the progress of its last checkpoint, and keeps
its original enqueue time (being preempted is not the job's fault, so it does not lose its age).

The bus is a trust boundary (rule 6): a ``Submitted`` whose spec fails
``proto.validation.revalidate_spec`` never enters the pending set, since scoring it could make
every round fail. The scorer does not end the job itself: the placer, the one writer of
refusals, publishes its ``Failed`` (see ``services.placer.tracker``), which this fold then
sees like any other end. A checkpoint's progress that is not a fraction in [0, 1] is ignored.

Snapshots (``encode``/``load``, ``services.scorer.service``): the scorer restarts from the set as
saved plus the events after the snapshot's sequence, which is the consumer's ack floor, so the
few events between that floor and the moment of encoding are applied a second time. Every rule is
therefore written so that replaying a run of events the set already holds changes nothing:
``Placed`` takes the job out only for an attempt at least its pending one (a replayed ``Placed``
of attempt 1 does not take out attempt 2), ``Preempted`` names its attempt and counts once per
attempt (a replayed one after the next ``Placed`` would otherwise queue a third attempt), and an
ended job ignores everything. Bounded: an ended job's id is kept (so that a ``Submitted``
replayed after its end cannot queue it again) only until ``keep_terminal_events`` lifecycle
events later. Why events and not time: what a restart replays again is bounded by the snapshot
cadence in events (``libs.bus.snapshot``), so an end older than that many events can never be
followed by a replay of its job's ``Submitted``; keep it far above MOSAIC_SNAPSHOT_EVERY_EVENTS.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from libs.obs.jobspans import clean_traceparent
from libs.policy.stages.shrink import fold_resize
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

SNAPSHOT_VERSION = 1  # bump when PendingSnapshot changes shape: older snapshots are then ignored
DEFAULT_KEEP_TERMINAL_EVENTS = 500_000  # an ended job is forgotten this many events after its end


class PendingSnapshot(msgspec.Struct, kw_only=True):
    """The set as stored in a snapshot (``PendingSet.encode``)."""

    version: int
    events: int
    refused: int
    pending: dict[str, PendingJob]
    specs: dict[str, JobSpec]  # live jobs (pending or placed)
    enqueued_at: dict[str, float]
    placed_attempt: dict[str, int]
    preempted_attempt: dict[str, int]
    progress: dict[str, float]
    terminal: list[tuple[str, int]]  # (job, events seen when it ended), oldest end first
    invalid: list[str]
    queued: dict[str, int]
    traces: dict[str, str] = {}  # live jobs' traceparents (absent before issue 13: none)


class _Version(msgspec.Struct):
    version: int


class PendingSet:
    def __init__(
        self,
        on_invalid: OnInvalid | None = None,
        *,
        keep_terminal_events: int = DEFAULT_KEEP_TERMINAL_EVENTS,
    ) -> None:
        """``on_invalid`` hears of each refused ``Submitted`` (the service logs it)."""
        if keep_terminal_events < 1:
            raise ValueError(f"keep_terminal_events must be >= 1, got {keep_terminal_events}")
        self._on_invalid = on_invalid
        self.keep_terminal_events = keep_terminal_events
        self.events = 0  # events applied (the clock of terminal retention)
        self.refused = 0  # Submitted events refused by revalidate_spec
        self.pending: dict[str, PendingJob] = {}
        self._specs: dict[str, JobSpec] = {}  # live jobs only (dropped when they end)
        self._enqueued_at: dict[str, float] = {}
        self._placed_attempt: dict[str, int] = {}
        self._progress: dict[str, float] = {}
        self._preempted_attempt: dict[str, int] = {}  # job -> highest attempt a Preempted ended
        self._terminal: dict[str, int] = {}  # job -> self.events at its end, oldest first
        self._invalid: set[str] = set()  # jobs whose first Submitted was refused
        self._queued: dict[str, int] = {}  # job -> attempt for which Queued is already out
        # live jobs whose latest attempt awaits its admission Queued (derived, not saved)
        self._unannounced: dict[str, None] = {}
        self._traces: dict[str, str] = {}  # live job -> its trace (Submitted.trace, cleaned)

    def apply(self, ev: LifecycleEvent) -> bool:
        """Fold one event in; True when a round is due (the pending set changed, or an attempt
        now awaits its admission score)."""
        changed = self._fold(ev)
        return self._refresh(ev.job_id) or changed

    def _fold(self, ev: LifecycleEvent) -> bool:
        self.events += 1
        self._expire()
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
            if trace := clean_traceparent(ev.trace):
                self._traces[job] = trace
            self._enqueued_at[job] = ev.spec.submit_time or ev.time
            if job not in self._placed_attempt:
                self.pending[job] = PendingJob(ev.spec, self._enqueued_at[job], attempt=1)
                return True
            return False
        if isinstance(ev, Queued):
            latest = self._latest_attempt(job)
            # only the scorer's own admission announcement counts: the placer's carry a reason
            # (were they counted, an early wait reason would leave the attempt unscored), and
            # one naming another attempt (published before a Placed and Preempted this fold
            # has already seen) is not this attempt's
            if latest and not ev.reason and ev.attempt in (0, latest):
                self._queued[job] = latest
            return False
        if isinstance(ev, Placed):
            self._placed_attempt[job] = max(ev.attempt, self._placed_attempt.get(job, 0))
            p = self.pending.get(job)
            if p is None or p.attempt > ev.attempt:
                return False  # a replayed Placed of an earlier attempt
            del self.pending[job]
            return True
        if isinstance(ev, Checkpointed):
            if sound_progress(ev.progress):
                self._progress[job] = ev.progress
            return False
        if isinstance(ev, Preempted):
            spec = self._specs.get(job)
            placed = self._placed_attempt.get(job, 0)
            attempt = ev.attempt or placed  # 0: an event from before Preempted named it
            if spec is None or job in self.pending or attempt < placed:
                return False
            if self._preempted_attempt.get(job, 0) >= attempt:
                return False  # this attempt's preemption was counted already (a replay)
            self._preempted_attempt[job] = attempt
            spec = self._specs[job] = fold_resize(spec, ev.resize_gpus)  # a shrink: resized
            self.pending[job] = PendingJob(
                spec,
                self._enqueued_at.get(job, ev.time),
                attempt=placed + 1,
                progress=self._progress.get(job, 0.0),
            )
            return True
        if is_terminal(ev):
            self._terminal[job] = self.events
            for d in (self._specs, self._enqueued_at, self._placed_attempt, self._progress):
                d.pop(job, None)
            self._preempted_attempt.pop(job, None)
            self._traces.pop(job, None)
            self._queued.pop(job, None)
            self._invalid.discard(job)
            return self.pending.pop(job, None) is not None
        return False

    def needs_queued_event(self, job_id: str) -> bool:
        """True when the job's latest attempt has not had its admission ``Queued`` yet."""
        return job_id in self._unannounced

    def unannounced(self) -> list[PendingJob]:
        """The attempts awaiting their admission ``Queued``, in the order they became due: the
        pending ones, and those the placer placed before the scorer got to them (it no longer
        waits for the scorer), so that every attempt is scored once and every job's trace has
        its ``scorer.score`` span."""
        out = []
        for job in self._unannounced:
            p = self.pending.get(job)
            if p is None:
                p = PendingJob(
                    self._specs[job],
                    self._enqueued_at.get(job, 0.0),
                    attempt=self._placed_attempt[job],
                    progress=self._progress.get(job, 0.0),
                )
            out.append(p)
        return out

    def mark_queued(self, job_id: str, attempt: int | None = None) -> None:
        """The job's latest attempt (or ``attempt``, if it still is the latest) has had its
        admission ``Queued``."""
        latest = self._latest_attempt(job_id)
        if latest and attempt in (None, latest):
            self._queued[job_id] = latest
        self._refresh(job_id)

    def _latest_attempt(self, job_id: str) -> int:
        """The live job's pending attempt, else the attempt it was last placed with; 0 for a job
        that is not live (unknown, refused, ended)."""
        p = self.pending.get(job_id)
        if p is not None:
            return p.attempt
        return self._placed_attempt.get(job_id, 0) if job_id in self._specs else 0

    def _refresh(self, job_id: str) -> bool:
        """Keep ``_unannounced`` in step with the fold; True when the job joined it."""
        latest = self._latest_attempt(job_id)
        if latest and self._queued.get(job_id) != latest:
            joined = job_id not in self._unannounced
            self._unannounced[job_id] = None
            return joined
        self._unannounced.pop(job_id, None)
        return False

    def is_terminal(self, job_id: str) -> bool:
        return job_id in self._terminal

    def trace_of(self, job_id: str) -> str:
        """The job's traceparent ("" when it has none): the parent of the scorer's spans."""
        return self._traces.get(job_id, "")

    def __len__(self) -> int:
        return len(self.pending)

    def _expire(self) -> None:
        """Forget ended jobs whose end is more than ``keep_terminal_events`` events old."""
        cutoff = self.events - self.keep_terminal_events
        while self._terminal:
            job, ended = next(iter(self._terminal.items()))
            if ended > cutoff:
                return
            del self._terminal[job]

    # --- snapshots ---------------------------------------------------------------------------

    def encode(self) -> bytes:
        """The whole set as msgpack bytes (``PendingSnapshot``)."""
        return msgspec.msgpack.encode(
            PendingSnapshot(
                version=SNAPSHOT_VERSION,
                events=self.events,
                refused=self.refused,
                pending=self.pending,
                specs=self._specs,
                enqueued_at=self._enqueued_at,
                placed_attempt=self._placed_attempt,
                preempted_attempt=self._preempted_attempt,
                progress=self._progress,
                terminal=list(self._terminal.items()),
                invalid=sorted(self._invalid),
                queued=self._queued,
                traces=self._traces,
            )
        )

    def load(self, data: bytes) -> PendingSet:
        """Replace the content by a snapshot's (keeping ``on_invalid`` and the retention);
        raises ``ValueError`` or a msgspec error for another version or a corrupt snapshot."""
        version = msgspec.msgpack.decode(data, type=_Version).version
        if version != SNAPSHOT_VERSION:
            raise ValueError(f"pending snapshot version {version}, expected {SNAPSHOT_VERSION}")
        snap = msgspec.msgpack.decode(data, type=PendingSnapshot)
        if not snap.pending.keys() <= snap.specs.keys():
            raise ValueError("pending snapshot holds a pending job without its spec")
        self.events, self.refused = snap.events, snap.refused
        self.pending = snap.pending
        self._specs = snap.specs
        self._enqueued_at = snap.enqueued_at
        self._placed_attempt = snap.placed_attempt
        self._preempted_attempt = snap.preempted_attempt
        self._progress = snap.progress
        self._terminal = dict(snap.terminal)
        self._invalid = set(snap.invalid)
        self._queued = snap.queued
        self._traces = snap.traces
        self._unannounced = {}
        for job in self._specs:
            self._refresh(job)
        return self
