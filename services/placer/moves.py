"""How the placer moves jobs: it commits the scheduler's own moves and answers intents.

Rule 2: the placer alone commits a move against the ledger. Two sources:

* the scheduler's decisions (``Decisions.moves``: the priority-protection rule of
  ``libs.policy.stages.preempt``), committed as they come;
* intents of the defragmenter and the thermal guard (``proto.intents`` on ``intents.*``, a
  durable consumer): each ``MoveIntent`` is checked by the scheduler (``check_move``: the
  attempt must be the one running, the job movable, its resume bound safe) and committed or
  refused; each ``HoldIntent`` holds a node out of placement (the scheduler's ``hot`` hold)
  until released or until its TTL lapses unrenewed.

A committed move is a ``node.<node>.checkpoint`` command (the executor saves the job and
answers ``Checkpointed`` + ``Preempted``; the job then waits again with its progress and a
resume deadline) and an audit record (``preempt``/``migrate``) on ``decisions.placer``; a
refusal is a ``refuse`` record naming the intent. Every record and command has a deterministic
message id, so a takeover that repeats one is deduplicated. A mixin of ``Placer``.
"""

from __future__ import annotations

import asyncio
import math

from opentelemetry import trace
from prometheus_client import Counter, Histogram

from libs.bus.connection import Bus
from libs.clock import Clock
from libs.obs.tracing import span_trace_id
from libs.policy.core import Scheduler
from libs.policy.decisions import MoveOrder
from proto import subjects
from proto.commands import CheckpointCommand
from proto.decisions import Decision
from proto.intents import (
    INTENT_SOURCES,
    MOVE_KINDS,
    HoldIntent,
    Intent,
    MoveIntent,
    sound_intent_id,
)
from proto.validation import sound_id
from services.placer.announce import SERVICE

MOVES = Counter("mosaic_placer_moves_total", "Moves committed (checkpoint and requeue).", ["kind"])
INTENTS = Counter("mosaic_placer_intents_total", "Intents answered.", ["source", "verdict"])
RESUME_DELAY = Histogram(
    "mosaic_resume_delay_seconds",
    "From a moved job's requeue to its next placement (Mosaic-clock seconds).",
    buckets=(10, 30, 60, 120, 300, 600, 900, 1200, 1800, 2700, 3600, 7200, math.inf),
)
HOT = "hot"  # the scheduler's hold name for a node the thermal guard holds (proto.intents)
MAX_TTL_S = 86_400.0


def intent_error(intent: Intent) -> str:
    """Why an intent cannot be acted on as sent ("" when it is sound), naming the field."""
    if not sound_intent_id(intent.id):
        return "id: must be 1-200 letters, digits, '_', '.', ':' or '-'"
    if intent.source not in INTENT_SOURCES:
        return f"source: must be one of {', '.join(INTENT_SOURCES)}"
    if not math.isfinite(intent.time):
        return "time: not a finite number"
    if not sound_id(intent.node):
        return "node: not a sound identifier"
    if isinstance(intent, MoveIntent):
        if not sound_id(intent.job_id):
            return "job_id: not a sound identifier"
        if intent.kind not in MOVE_KINDS:
            return f"kind: {intent.kind!r} is not one of {', '.join(MOVE_KINDS)}"
        if intent.attempt < 1:
            return "attempt: must be >= 1"
        if isinstance(intent.shrink_to, bool) or intent.shrink_to < 0:
            return "shrink_to: must be a GPU count >= 0"
    elif intent.on and not 0.0 < intent.ttl_s <= MAX_TTL_S:  # a release needs no TTL
        return f"ttl_s: must be in (0, {MAX_TTL_S:.0f}]"
    return ""


class MoveCommitter:
    bus: Bus
    clock: Clock
    log: object
    tracer: trace.Tracer
    _kick: asyncio.Event
    active: bool

    def _init_moves(self) -> None:
        self._intent_inbox: list[Intent] = []
        self.hot_until: dict[str, float] = {}  # node -> when its hot hold lapses (Mosaic clock)
        self.moves_owed: list[MoveOrder] = []  # decided by the scheduler, not yet sent

    async def _on_intent(self, intent: Intent) -> None:
        """The consumer's handler: the next cycle answers it (in the cycle, under the lock)."""
        self._intent_inbox.append(intent)
        self._kick.set()

    def hot_nodes(self, now: float) -> set[str]:
        """Nodes the thermal guard holds now (unrenewed holds lapse)."""
        for node in [n for n, t in self.hot_until.items() if t <= now]:
            del self.hot_until[node]
        return set(self.hot_until)

    def _take_holds(self, now: float) -> None:
        """Apply the hold intents received (before the scheduler syncs its holds)."""
        for intent in self._intent_inbox:
            if isinstance(intent, HoldIntent) and not intent_error(intent):
                if intent.on and intent.time + intent.ttl_s > now:
                    self.hot_until[intent.node] = intent.time + intent.ttl_s
                elif not intent.on:
                    self.hot_until.pop(intent.node, None)

    async def _answer_intents(self, sched: Scheduler, now: float) -> None:
        """Commit or refuse each move intent received (the holds were taken before the sync)."""
        inbox, self._intent_inbox = self._intent_inbox, []
        for intent in inbox:
            error = intent_error(intent)
            if isinstance(intent, HoldIntent) and not error:
                INTENTS.labels(intent.source, "held" if intent.on else "released").inc()
                continue
            if not error:
                assert isinstance(intent, MoveIntent)
                error = sched.check_move(
                    intent.job_id,
                    intent.attempt,
                    intent.node,
                    now,
                    shrink_to=intent.shrink_to,
                    kind=intent.kind,
                )
            if error:
                await self._refuse_intent(intent, error, now)
                continue
            assert isinstance(intent, MoveIntent)
            move = MoveOrder(
                intent.job_id,
                intent.attempt,
                intent.node,
                intent.kind,
                intent.reason,
                for_job=intent.for_job,
                intent=intent.id,
                source=intent.source,
                # a shrink resumes at once on the node it shrinks on (its room, held for it)
                to_node=intent.node if intent.shrink_to else "",
                shrink_to=intent.shrink_to,
            )
            await self._commit_move(sched.order_move(move, now), now)
            INTENTS.labels(intent.source, "committed").inc()

    async def _commit_moves(self, now: float) -> None:
        """Send the moves owed (``moves_owed``: decided by a tick, oldest first). A cycle cut
        short by a NATS error leaves the rest owed, and the next cycle sends them with the same
        message ids (a repeat is one message): the scheduler already counts them under way."""
        while self.moves_owed and self.active:
            await self._commit_move(self.moves_owed[0], now)
            self.moves_owed.pop(0)

    async def _commit_move(self, move: MoveOrder, now: float) -> None:
        """Send the checkpoint and the audit record of one move, in the job's trace."""
        job = move.job_id
        attrs = {"job": job, "node": move.node, "kind": move.kind, "source": move.source}
        with self._job_span(f"placer.{move.kind}", job, attrs) as span:  # type: ignore[attr-defined]
            cmd = CheckpointCommand(
                job_id=job,
                reason=f"{move.kind}: {move.reason}"[:500],
                attempt=move.attempt,
                shrink_to=move.shrink_to,
            )
            decision = Decision(
                job_id=job,
                time=now,
                action=move.kind,
                service=SERVICE,
                node=move.node,
                reason=move.reason,
                trace_id=span_trace_id(span),
                intent=move.intent,
            )
            await asyncio.gather(
                self.bus.publish(
                    subjects.node_command(move.node, "checkpoint"),
                    cmd,
                    msg_id=f"checkpoint-{job}-{move.attempt}",
                ),
                self.bus.publish(
                    subjects.decisions(SERVICE),
                    decision,
                    msg_id=f"decision-{move.kind}-{job}-{move.attempt}",
                ),
            )
        MOVES.labels(move.kind).inc()
        self.log.info("move", job=job, node=move.node, kind=move.kind, source=move.source)  # type: ignore[attr-defined]

    async def _refuse_intent(self, intent: Intent, why: str, now: float) -> None:
        job = intent.job_id if isinstance(intent, MoveIntent) else ""
        # the label is bounded: a forged sender is counted as one, not as a label of its own
        source = intent.source if intent.source in INTENT_SOURCES else "unknown"
        INTENTS.labels(source, "refused").inc()
        decision = Decision(
            job_id=job if sound_id(job) else "",
            time=now,
            action="refuse",
            service=SERVICE,
            node=getattr(intent, "node", None) or None,
            reason=f"intent {intent.id[:64]} from {intent.source[:32]}: {why}",
            intent=intent.id[:128],
        )
        msg_id = f"decision-refuse-intent-{intent.id[:128]}"
        await self.bus.publish(subjects.decisions(SERVICE), decision, msg_id=msg_id)
        self.log.info("intent_refused", intent=intent.id[:64], why=why)  # type: ignore[attr-defined]
