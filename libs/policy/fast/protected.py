"""The queued jobs of protected priority in the order they were queued: what the
priority-protection rule asks at every instant, answered without a scan of the queue.

Why: the rule looks at every instant, woken or not (``core_moves.preempt_step``), and asks
when the next protected job will have waited long enough (``next_move_s``). Written as
definitions, both scan the whole queue's priority column (``MovesMixin._protected_rows``) twice
per instant, on a queue of thousands, mostly to find that no job is eligible yet. Kept here as
jobs join and leave, each question is a bisection. Tested equal to the definitions
(``tests/policy/test_protected.py``).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from libs.policy.types import PendingJob


class ProtectedWaits:
    """Queued jobs of priority >= ``protect_priority``, sorted by ``enqueued_at``."""

    def __init__(self, protect_priority: int) -> None:
        self.protect_priority = protect_priority
        self._enq: list[float] = []  # enqueued_at, ascending (the queue table's "enq" column)
        self._ids: list[str] = []  # the job of each, same positions
        self._of: dict[str, float] = {}  # job -> its enqueued_at

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, job: PendingJob) -> None:
        """A job joined the queue (or replaced its entry)."""
        jid = job.spec.id
        self.remove(jid)
        if job.spec.priority < self.protect_priority:
            return
        enq = float(job.enqueued_at)
        k = bisect_right(self._enq, enq)
        self._enq.insert(k, enq)
        self._ids.insert(k, jid)
        self._of[jid] = enq

    def remove(self, job_id: str) -> None:
        """A job left the queue (started, cancelled)."""
        enq = self._of.pop(job_id, None)
        if enq is None:
            return
        k = bisect_left(self._enq, enq)
        while self._ids[k] != job_id:  # among equal enqueued_at
            k += 1
        del self._enq[k]
        del self._ids[k]

    def waited_since(self, cutoff: float) -> list[str]:
        """The jobs queued at or before ``cutoff`` (``enq <= cutoff``), oldest first."""
        return self._ids[: bisect_right(self._enq, cutoff)]

    def next_ready_s(self, now: float, wait_s: float) -> float | None:
        """The earliest ``enqueued_at + wait_s`` after ``now`` (None: none), computed as the
        definition does (the sum, then the comparison), so the same float."""
        k = bisect_right(self._enq, now, key=lambda e: e + wait_s)  # the sum is monotone
        return self._enq[k] + wait_s if k < len(self._enq) else None
