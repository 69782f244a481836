"""The audit read model: the latest decisions about each job, for ``mosaic explain``.

Why in the gateway: "why is my job pending / why did it land there" is asked over HTTP; the
answers are the ``Decision`` records the policy services put on the DECISIONS stream (rule 5).
Only the newest few per job are kept, for at most ``max_jobs`` jobs (the oldest forgotten first,
and a job's decisions go when the jobs model forgets the job): the stream itself is the full
audit trail while its retention lasts. Like the jobs model it encodes itself, so the gateway
restarts from a snapshot; applying a decision it already holds changes nothing, which is what a
restart that replays a few already-snapshotted messages needs.
"""

from __future__ import annotations

from collections import deque

import msgspec

from proto.decisions import Decision

KEEP_PER_JOB = 10
DEFAULT_MAX_JOBS = 200_000  # jobs with decisions held; about twice the finished jobs kept
SNAPSHOT_VERSION = 1  # bump when DecisionsSnapshot changes shape: old snapshots are ignored


class DecisionsSnapshot(msgspec.Struct, kw_only=True):
    version: int
    by_job: list[tuple[str, list[Decision]]]  # oldest job first, each job's oldest first


class _Version(msgspec.Struct):
    version: int


class DecisionsModel:
    def __init__(self, keep_per_job: int = KEEP_PER_JOB, max_jobs: int = DEFAULT_MAX_JOBS) -> None:
        self._keep = keep_per_job
        self._max_jobs = max_jobs
        self._by_job: dict[str, deque[Decision]] = {}

    def __len__(self) -> int:
        return len(self._by_job)

    def apply(self, decision: Decision) -> bool:
        """Keep ``decision``; False for one already kept (a replayed message)."""
        q = self._by_job.get(decision.job_id)
        if q is None:
            q = self._by_job[decision.job_id] = deque(maxlen=self._keep)
            while len(self._by_job) > self._max_jobs:
                del self._by_job[next(iter(self._by_job))]
        elif decision in q:
            return False
        q.append(decision)
        return True

    def forget(self, job_id: str) -> None:
        self._by_job.pop(job_id, None)

    def for_job(self, job_id: str) -> list[Decision]:
        """Oldest first."""
        return list(self._by_job.get(job_id, ()))

    def encode(self) -> bytes:
        by_job = [(job, list(q)) for job, q in self._by_job.items()]
        return msgspec.msgpack.encode(DecisionsSnapshot(version=SNAPSHOT_VERSION, by_job=by_job))

    def load(self, data: bytes) -> DecisionsModel:
        """Replace the content by a snapshot's; raises for another version or a corrupt one."""
        version = msgspec.msgpack.decode(data, type=_Version).version
        if version != SNAPSHOT_VERSION:
            raise ValueError(f"decisions snapshot version {version}, this build {SNAPSHOT_VERSION}")
        snap = msgspec.msgpack.decode(data, type=DecisionsSnapshot)
        self._by_job = {job: deque(ds, maxlen=self._keep) for job, ds in snap.by_job}
        return self
