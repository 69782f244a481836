"""The short-wait rule's wake-up (``stages.short_wait.next_due_s``), kept across instants.

Why: ``next_move_s`` is asked at every instant of a replay, and the definition scans the
queue (0.1-0.3 ms for 500-10,000 rows; a full Philly replay has about 280k events). The owed
instants (``short_wait.owed_s``) change only when the queue does (``PendingQueue.version``), when
the rule looks (``looked_s``, ``due_s``), or with the fastest speeds or the config; between
those they are kept sorted and each instant's answer is a binary search. Tested equal to the
definition (``tests/policy/test_short_wait.py``).
"""

from __future__ import annotations

import numpy as np

from libs.policy.config import PreemptConfig
from libs.policy.queue import PendingQueue
from libs.policy.stages import short_wait as SW


class ShortDue:
    """The owed instants, sorted, and the inputs they were computed from."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._pc: PreemptConfig | None = None
        self._due = np.zeros(0)

    def next_s(
        self,
        queue: PendingQueue,
        now: float,
        best: np.ndarray,
        pc: PreemptConfig,
        looked_s: float,
        due_s: float,
    ) -> float | None:
        """``short_wait.next_due_s`` of ``queue.table()`` (the same arguments)."""
        key = (queue.version, looked_s, due_s, best.tobytes())
        if key != self._key or pc is not self._pc:
            self._due = np.sort(SW.owed_s(queue.table(), best, pc, looked_s, due_s))
            self._key, self._pc = key, pc
        due = self._due
        k = int(np.searchsorted(due, now, side="right"))  # due[:k] <= now < due[k:]
        if k == len(due):
            return None if not k else now + max(pc.interval_s, 1.0)
        return float(due[k]) if not k else min(float(due[k]), now + max(pc.interval_s, 1.0))
