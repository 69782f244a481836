"""The guard's actions as wire records: an intent for the placer and an audit record each.

Pure conversions (``libs.policy.stages.thermal`` actions -> ``proto.intents`` and
``proto.decisions.Decision``); the service publishes them. Intent ids are deterministic, so
the JetStream duplicate window drops a repeat (a guard restarted on the same samples asks
the same thing once): a hold is named by node, on/off and the sample time that caused it, a
migration by job attempt.
"""

from __future__ import annotations

import msgspec

from libs.policy.stages.thermal import HoldAction, MigrateAction
from proto.decisions import Decision
from proto.intents import HOLD_HOT, HoldIntent, MoveIntent

SOURCE = "thermal"


def hold_intent(action: HoldAction, *, now: float, sample_s: float, trace: str) -> HoldIntent:
    state = "on" if action.on else "off"
    intent = HoldIntent(
        id=f"thermal-hold-{action.node}-{state}-{sample_s * 1000:.0f}",
        source=SOURCE,
        time=now,
        reason=action.reason,
        trace=trace,
        node=action.node,
        hold=HOLD_HOT,
        on=action.on,
    )
    # a release keeps the contract's default TTL: the placer checks every hold's ttl_s > 0
    return msgspec.structs.replace(intent, ttl_s=action.ttl_s) if action.on else intent


def move_intent(action: MigrateAction, *, now: float, trace: str) -> MoveIntent:
    return MoveIntent(
        id=f"thermal-move-{action.job_id}-{action.attempt}",
        source=SOURCE,
        time=now,
        reason=action.reason,
        trace=trace,
        job_id=action.job_id,
        attempt=action.attempt,
        node=action.node,
        kind="migrate",
    )


def audit(intent: HoldIntent | MoveIntent, *, trace_id: str | None) -> Decision:
    """The audit record of one intent. A hold names no job (``job_id`` ""): its action is
    ``cordon`` (held or renewed) or ``uncordon`` (released)."""
    if isinstance(intent, MoveIntent):
        job, verb = intent.job_id, "migrate"
    else:
        job, verb = "", "cordon" if intent.on else "uncordon"
    return Decision(
        job_id=job,
        time=intent.time,
        action=verb,
        service=SOURCE,
        node=intent.node,
        reason=intent.reason,
        trace_id=trace_id,
        intent=intent.id,
    )
