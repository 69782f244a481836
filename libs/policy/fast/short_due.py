"""The short-wait rule's wake-up and its eligible rows (``stages.short_wait``), kept per row.

Why: ``next_move_s`` is asked at every instant of a replay and the queue changes at nearly
every one (an arrival, a start), so a memo of the whole answer keyed on ``PendingQueue.version``
recomputed ``short_wait.owed_s`` over the whole queue, and sorted it, at almost every instant
(8-10 % of a Philly replay); the rule's own look (``eligible_rows``) recomputed the same act
times over the whole queue again. Yet a job's act times (``short_wait.act_times_s``: its wait
bound and deadline window) and whether it is short (``short_wait.short_rows``) read only its
own row, the fastest speeds (``best``) and the config: they are computed once when the row
joins (a ``PendingQueue.column``, moved with its row, cleared when it is replaced) and kept.

The wake-up from them. A short job's owed instant is max(a_j, ``due_s``), a_j its first
candidate (its wait bound; its window's opening when the window is not empty) after
``looked_s``. The least candidate over all jobs after ``looked_s`` is min_j a_j, so one heap of
candidates (lazily dropped: a job that left or was replaced, one at or before ``looked_s``,
which only moves forward) answers: before ``due_s`` every owed instant is after ``now`` and the
wake-up is max(min_j a_j, ``due_s``); from ``due_s`` on, the least a_j after ``now`` is the
answer too; else (the rule was owed a look it could not take: the other rules took the
budget, rare) the definition (``next_due_s``) answers. ``eligible`` is ``eligible_rows``
read off the same column, and ``fastest`` keeps ``best`` per ``ModelTables`` object. Tested
equal to the definitions (``tests/policy/test_short_wait.py``); nothing in ``stages``
depends on this module.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from libs.policy.config import PreemptConfig
from libs.policy.queue import PendingQueue
from libs.policy.scores import ModelTables
from libs.policy.stages import short_wait as SW

_COLUMN = "short_due"
# the kept column, per row: my generation number (identifies a row's content: a replaced row
# gets a new one), remaining on the fastest model, slow_at, dl_from, dl_to, short (1.0 / 0.0)
_GEN, _REM, _SLOW, _FROM, _TO, _SHORT = range(6)
_WIDTH = 6


class ShortDue:
    """Per-row act times (a queue column) and a heap of the short jobs' candidate instants;
    owned by one ``MoveBook``, for the scheduler's one queue."""

    def __init__(self) -> None:
        self._queue: PendingQueue | None = None
        self._version = -1  # the queue's version the column and heap are in step with
        self._best = b""  # best.tobytes() and pc the act times were computed from
        self._pc: PreemptConfig | None = None
        self._token = object()  # the column's key: renewed with best's bytes or pc
        self._gen = 0  # the next generation number
        self._looked = -np.inf  # entries at or before it were dropped
        # (candidate instant, generation, insertion sequence) of short rows, a min-heap
        self._heap: list[tuple[float, float, float]] = []
        self._col = np.zeros((0, _WIDTH))  # the column's view at ``_version``
        self._tables: ModelTables | None = None  # ``fastest``'s memo
        self._fastest = np.zeros(0)

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
        col = self._sync(queue, best, pc)
        if looked_s < self._looked:  # never in a run (a look only moves it on): start over
            self._looked = looked_s
            self._rebuild(queue, col)
        self._looked = looked_s
        top = self._top(queue, col)
        if top is None:
            return None
        if now < due_s:
            return max(top, due_s)
        if top > now:  # due_s <= now < every a_j: each owed instant is its a_j
            return top
        return SW.next_due_s(queue.table(), now, best, pc, looked_s, due_s)

    def fastest(self, tables: ModelTables) -> np.ndarray:
        """``tables.speed.max(axis=0)``, the fastest speed per class (``best``), kept while the
        tables are the same object (``ModelTables.build`` keeps one per view; it is frozen):
        the wake-up is asked at every instant."""
        if tables is not self._tables:
            self._tables, self._fastest = tables, tables.speed.max(axis=0)
        return self._fastest

    def eligible(
        self, queue: PendingQueue, now: float, best: np.ndarray, pc: PreemptConfig
    ) -> tuple[np.ndarray, np.ndarray]:
        """``short_wait.eligible_rows(queue.table(), now, best, pc)`` from the kept act times."""
        if not len(queue):
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        col = self._sync(queue, best, pc)
        short = col[:, _SHORT] > 0.5
        rows = np.flatnonzero(SW.acting_now(short, col[:, _SLOW], col[:, _FROM], col[:, _TO], now))
        return rows, col[rows, _REM]

    def _sync(self, queue: PendingQueue, best: np.ndarray, pc: PreemptConfig) -> np.ndarray:
        """The column, with every row's act times: computed for the rows that joined (or were
        replaced) since the last call, all of them when ``best``, ``pc`` or the queue changed."""
        fresh = queue is not self._queue
        raw = best.tobytes()
        if fresh or raw != self._best or pc is not self._pc:
            self._queue, self._best, self._pc = queue, raw, pc
            self._token = object()  # the column is cleared whole (its key changed)
            self._heap = []
            self._version = -1
            if fresh:
                self._looked = -np.inf
        elif queue.version == self._version:  # the same rows: the same view of the column
            return self._col
        col = self._col = queue.column(_COLUMN, _WIDTH, (self._token,))
        self._version = queue.version
        new = np.flatnonzero(np.isnan(col[:, _GEN]))
        if len(new):
            self._fill(queue, col, new, best, pc)
        return col

    def _fill(
        self,
        queue: PendingQueue,
        col: np.ndarray,
        new: np.ndarray,
        best: np.ndarray,
        pc: PreemptConfig,
    ) -> None:
        """Compute rows ``new``'s act times (the definitions on those rows only: each value is
        the same element-wise computation as on the whole table) and file their candidates."""
        table = queue.table()[new]
        rem, slow_at, dl_from, dl_to = SW.act_times_s(table, best, pc)
        gens = np.arange(self._gen, self._gen + len(new), dtype=float)
        self._gen += len(new)
        got = np.array([gens, rem, slow_at, dl_from, dl_to, SW.short_rows(table, rem, pc)]).T
        col[new] = got
        entries = self._entries(got, queue.seq()[new])
        if len(entries) > len(self._heap):  # many rows (a start, a reset): one heapify
            self._heap.extend(entries)
            heapq.heapify(self._heap)
        else:
            for e in entries:
                heapq.heappush(self._heap, e)

    def _entries(self, got: np.ndarray, seqs: np.ndarray) -> list[tuple[float, float, float]]:
        """The heap entries of the rows ``got`` holds (their column values; ``seqs``: their
        insertion sequences), short rows only: the wait bound, and the window's opening when
        the window is not empty; each finite and after ``looked_s`` (an instant that is not
        finite is never owed, and ``looked_s`` only moves forward)."""
        looked = self._looked
        out: list[tuple[float, float, float]] = []
        short = got[:, _SHORT] > 0.5
        for (gen, _, slow, frm, to, _), seq in zip(
            got[short].tolist(), seqs[short].tolist(), strict=True
        ):
            if slow > looked and math.isfinite(slow):
                out.append((slow, gen, seq))
            if frm <= to and frm > looked and math.isfinite(frm):  # False for NaN, as numpy
                out.append((frm, gen, seq))
        return out

    def _rebuild(self, queue: PendingQueue, col: np.ndarray) -> None:
        """The heap anew from the column: every queued row's live candidates."""
        self._heap = self._entries(col, queue.seq())
        heapq.heapify(self._heap)

    def _top(self, queue: PendingQueue, col: np.ndarray) -> float | None:
        """The least live candidate after ``looked_s`` (min_j a_j), dropping the dead entries
        on the way: at or before ``looked_s``, or of a row that left or was replaced."""
        heap, looked = self._heap, self._looked
        if len(heap) > 4 * len(queue) + 1024:  # mostly dead entries of jobs that left: compact
            self._rebuild(queue, col)
            heap = self._heap
        while heap:
            at, gen, seq = heap[0]
            if at > looked:
                row = queue.row_of_seq(seq)
                if row is not None and col[row, _GEN] == gen:
                    return at
            heapq.heappop(heap)
        return None
