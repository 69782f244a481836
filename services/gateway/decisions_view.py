"""The audit read model: the latest decisions about each job, for ``mosaic explain``.

Why in the gateway: "why is my job pending / why did it land there" is asked over HTTP; the
answers are the ``Decision`` records the policy services put on the DECISIONS stream (rule 5).
Only the newest few per job are kept: the stream itself is the full audit trail.
"""

from __future__ import annotations

from collections import deque

from proto.decisions import Decision

KEEP_PER_JOB = 10


class DecisionsModel:
    def __init__(self, keep_per_job: int = KEEP_PER_JOB) -> None:
        self._keep = keep_per_job
        self._by_job: dict[str, deque[Decision]] = {}

    def apply(self, decision: Decision) -> None:
        q = self._by_job.get(decision.job_id)
        if q is None:
            q = self._by_job[decision.job_id] = deque(maxlen=self._keep)
        q.append(decision)

    def for_job(self, job_id: str) -> list[Decision]:
        """Oldest first."""
        return list(self._by_job.get(job_id, ()))
