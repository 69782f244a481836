"""Audit records: why a job was placed, refused, preempted or migrated; dead letters."""

from __future__ import annotations

import msgspec


class CandidateScore(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    total: float
    terms: dict[str, float] = {}


class WaitNumbers(msgspec.Struct, frozen=True, kw_only=True):
    """A pending job's wait with numbers, as of the decision's time (``mosaic explain``, like
    ``sprio`` and ``squeue --start``): its place in line, its priority score and terms, the node
    closest to holding it and what that node lacks, and its reservation's expected start."""

    rank: int  # 1 = next in line
    queued: int  # jobs pending in all
    score: float
    terms: dict[str, float] = {}
    regime: str = ""
    # the policy in force at the decision's time (``libs.policy.daynight``): the calendar's
    # period ("day", "night"; "" with the calendar off) and what it sets, the regime's rank
    # weights included (``daynight.in_force``: the names ``mosaic policy`` prints)
    period: str = ""
    policy: dict[str, float] = {}
    best_node: str | None = None
    lacks: str = ""
    reservation_node: str | None = None
    expected_start_s: float | None = None


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """One decision of a policy service, with what it weighed. Goes to the ``decisions`` stream."""

    job_id: str
    time: float
    action: str  # place | refuse | wait | preempt | migrate | cordon
    service: str
    node: str | None = None
    reason: str = ""
    candidates: tuple[CandidateScore, ...] = ()
    filtered: dict[str, str] = {}  # node -> why it could not take the job
    trace_id: str | None = None
    wait: WaitNumbers | None = None  # a ``wait``: where the job stands, with numbers
    intent: str = ""  # the proto.intents id this decision answers (a committed or refused move)


class DeadLetter(msgspec.Struct, frozen=True, kw_only=True):
    service: str
    subject: str
    reason: str
    time: float
    data: bytes = b""
