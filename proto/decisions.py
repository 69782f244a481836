"""Audit records: why a job was placed, refused, preempted or migrated, and the ranked queue."""

from __future__ import annotations

import msgspec

from proto.jobs import JobSpec


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


class RankedEntry(msgspec.Struct, frozen=True, kw_only=True):
    spec: JobSpec
    score: float
    terms: dict[str, float] = {}
    enqueued_at: float = 0.0


class RankedQueue(msgspec.Struct, frozen=True, kw_only=True):
    """The scorer's output: pending jobs best-first. Latest value in KV ``queue``/``ranked``."""

    time: float
    load: float
    regime: str
    entries: tuple[RankedEntry, ...] = ()


class DeadLetter(msgspec.Struct, frozen=True, kw_only=True):
    service: str
    subject: str
    reason: str
    time: float
    data: bytes = b""
