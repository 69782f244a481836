"""Audit records: why a job was placed, refused, preempted or migrated; dead letters."""

from __future__ import annotations

import msgspec


class CandidateScore(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    total: float
    terms: dict[str, float] = {}


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


class DeadLetter(msgspec.Struct, frozen=True, kw_only=True):
    service: str
    subject: str
    reason: str
    time: float
    data: bytes = b""
