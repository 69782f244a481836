"""Intents: what the defragmenter and the thermal guard ask the placer to do (rule 2).

Why intents and not actions: the placer alone writes allocations. A service that wants a job
moved or a node held sends an intent on ``intents.<service>`` (stream INTENTS); the placer
checks it against the current ledger and the policy's own rule (``libs.policy.stages.preempt``:
never a protected job, never one moved within the rate-limit window, never one whose resume
bound the move could break) and commits or refuses it, with a ``preempt``/``migrate``/
``refuse`` audit record on ``decisions.placer`` naming the intent.

- ``MoveIntent``: checkpoint a running attempt and put the job back in the queue with its
  progress and a resume deadline. ``kind`` says why: ``preempt`` (room for ``for_job``, the
  defragmenter's plan) or ``migrate`` (leave this node: the thermal guard). ``shrink_to``
  (elastic jobs): restart with that many GPUs instead of stopping (0 = not a shrink).
- ``HoldIntent``: hold a node out of placement (``on``) for a named reason (``hot``) or release
  it. A hold lapses when not renewed within ``ttl_s`` (the guard renews it each window while
  the node is hot), so a guard that dies leaves no node cordoned for ever; the policy's filter
  still refuses a node at or above its thermal limit for new work in the meantime.
"""

from __future__ import annotations

import re

import msgspec

MOVE_KINDS = ("preempt", "migrate")
# who may send intents (``source``, and the subject ``intents.<source>`` NATS permits them on)
INTENT_SOURCES = ("defrag", "thermal")
_ID = re.compile(r"[A-Za-z0-9_.:-]{1,200}")


def sound_intent_id(value: str) -> bool:
    """An intent id: 1-200 letters, digits, '_', '.', ':' or '-' (it names a job id, 64 at
    most, with the sender's prefix and the attempt, and is the message's Nats-Msg-Id)."""
    return isinstance(value, str) and bool(_ID.fullmatch(value))


HOLD_HOT = "hot"  # the thermal guard's hold name (the scheduler's cordon holds: core.Scheduler)


class _Intent(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    id: str  # unique per intent (Nats-Msg-Id): a redelivery is not acted on twice
    source: str  # the sending service: "defrag" | "thermal"
    time: float  # Mosaic clock, when it was decided
    reason: str  # one line an operator reads in `mosaic explain`
    trace: str = ""  # W3C traceparent of the sender's decision span


class MoveIntent(_Intent, tag="move"):
    job_id: str
    attempt: int  # the attempt to move: stale once the job runs another
    node: str  # where that attempt runs (checked against the ledger)
    kind: str = "preempt"  # MOVE_KINDS
    for_job: str = ""  # the job the move makes room for (defrag), "" for none
    shrink_to: int = 0  # elastic: restart with this many GPUs; 0: checkpoint and requeue


class HoldIntent(_Intent, tag="hold"):
    node: str
    hold: str = HOLD_HOT
    on: bool = True
    ttl_s: float = 60.0  # Mosaic-clock seconds the hold lasts unless renewed


Intent = MoveIntent | HoldIntent
