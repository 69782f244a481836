"""The walk: a pass's rows in rank order, a prefix sorted up front and the rest on demand,
and the bulk mode that drops dead rows with one compiled call instead of a Python step each
(design notes: "Bulk walk")."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from libs.policy import fast as K
from libs.policy.priority import order_of

BULK_SKIP = True  # tests turn it off to compare the bulk walk with the row-by-row one
BULK_CHUNK = 64  # rows the bulk walk sorts at a time


def full_walk(prefix: np.ndarray, scores: np.ndarray, enq: np.ndarray, tie=None) -> Walk:
    """The computed prefix, then (only if the pass gets that far) the rest of the full order."""
    n = len(prefix)
    tie = np.arange(len(scores)) if tie is None else tie
    tail = None if n >= len(scores) else (lambda: order_of(scores, enq, None, tie)[n:])
    return Walk(prefix.tolist(), None, tail, (scores, enq, tie))


class Walk:
    """Rows in rank order: a prefix known up front (rows, or book keys read through
    ``row_of``), then, only if the pass gets that far, the rest of the full order (``tail``).

    ``skip_dead(dead, full)`` switches to bulk mode for the rest of the pass: the rows ranked
    after the current one are selected by comparing rank keys (score, enqueue time, tie) over
    the whole queue at once, the ones ``dead`` marks are dropped (``dead.live(rows)``), and
    only the others are sorted and handed out. A long queue behind a full cluster is mostly
    such rows (their request shape already failed in this pass), so a pass neither sorts the
    whole queue nor takes a Python step per row. ``walked_in_bulk`` still reports them: they
    are passed over in rank order, exactly as a row-by-row walk passes over them."""

    __slots__ = (
        "_after",
        "_dead",
        "_dirty",
        "_first",
        "_first_whole",
        "_full",
        "_halted",
        "_handed",
        "_j",
        "_k",
        "_keys",
        "_last",
        "_live",
        "_pool",
        "_pool_clean",
        "_prefix",
        "_row_of",
        "_t",
        "_tail",
        "_tail_fn",
        "_unsorted",
    )

    def __init__(self, prefix: Sequence, row_of, tail, keys) -> None:
        self._prefix = prefix
        self._row_of = row_of
        self._tail_fn = tail
        self._keys = keys  # (score, enqueue time, tie) per row: the rank key
        self._k = 0  # next prefix index
        self._tail: list[int] | None = None
        self._t = 0  # next tail index
        self._last = -1  # the row handed out last
        self._dead = None
        self._full = None
        self._halted = False
        self._handed = False  # a row was handed out in bulk mode
        self._after = np.zeros(0, dtype=np.int64)  # bulk: rows ranked after the switch row
        self._live = np.zeros(0, dtype=np.int64)  # bulk: rows still to hand out, rank order
        self._pool = self._live  # bulk: rows after ``_live``, not sorted yet
        self._pool_clean = False  # ``_pool`` filtered since the last ``refilter``
        self._first: np.ndarray | None = None  # bulk: the order's prefix sorted at the switch
        self._first_whole = False  # ``_first`` holds every row ranked after the switch
        self._j = 0
        self._dirty = False
        self._unsorted = False

    def __iter__(self) -> Walk:
        return self

    def __next__(self) -> int:
        if self._dead is not None:
            return self._next_bulk()
        k = self._k
        if k < len(self._prefix):
            self._k = k + 1
            x = self._prefix[k]
            self._last = x if self._row_of is None else self._row_of(x)
            return self._last
        if self._tail is None:
            self._tail = self._tail_fn().tolist() if self._tail_fn is not None else []
        t = self._t
        if t >= len(self._tail):
            raise StopIteration
        self._t = t + 1
        self._last = self._tail[t]
        return self._last

    @property
    def bulk(self) -> bool:
        return self._dead is not None

    def _ranked_after(self, row: int, rows: np.ndarray, after: bool = True) -> np.ndarray:
        """The rows of ``rows`` ranked after ``row`` (``after=False``: the others), in the
        order given."""
        s, e, q = self._keys
        return K.rows_ranked_after(rows, s, e, q, s[row], e[row], q[row], after)

    def _sorted(self, rows: np.ndarray) -> np.ndarray:
        return self._top(rows, len(rows))[0]

    def _top(self, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(the rows of ``rows`` scoring at least the k-th best score, in rank order; the
        others, in the order given): ``order_of(..., top=k)`` of the rows, in one compiled
        call (``fast.top_rows``) or, when a key is NaN, through numpy."""
        s, e, q = self._keys
        best, rest, ok = K.top_rows(rows, s, e, q, k)
        if ok:
            return best, rest
        part = order_of(s[rows], e[rows], k if k < len(rows) else None, q[rows])
        left = np.ones(len(rows), dtype=bool)
        left[part] = False
        return rows[part], rows[left]

    def skip_dead(self, dead, full, prefix: int | None = None) -> None:
        """From now on hand out only the rows ``dead.live(rows)`` keeps, and end the walk
        as soon as ``full()`` (nothing more can start in this pass). ``prefix``: the caller
        will ask ``walked_in_bulk`` for at most that many rows."""
        self._dead = dead
        self._full = full
        cand = self._ranked_after(self._last, np.arange(len(self._keys[0])))
        self._after = cand
        dead.assign(cand)
        if prefix is None:
            # sorted when the first row is asked for: the pass may mark more rows dead before
            # (``DeadRows.screen``), and only the rows left are worth sorting
            self._live = cand
            self._unsorted = True
            return
        # the first ``prefix`` rows of the order (ties included: an exact prefix) are sorted
        # now, once: they are the walked rows ``walked_in_bulk`` reports, and the first rows
        # handed out are their live ones (filtered when the first is asked for); the rest
        # is the pool the later chunks come from
        self._first, self._pool = self._top(cand, prefix)
        self._first_whole = not len(self._pool)
        self._live = self._first
        self._j = 0
        self._dirty = True
        self._pool_clean = False

    def refilter(self) -> None:
        """More rows may be dead now (a shape failed, a placement shrank the largest free
        block): drop them from the rows left before the next one is handed out."""
        self._dirty = True
        self._pool_clean = False

    def _next_bulk(self) -> int:
        if self._full():
            self._halted = True
            raise StopIteration
        if self._unsorted:
            # the rows left are sorted a chunk at a time: a pass usually fills the cluster
            # after a few of them, and a long queue behind a full cluster has thousands
            self._unsorted = False
            self._dirty = False
            self._pool = self._dead.live(self._live)
            self._pool_clean = True
            self._live = self._pool[:0]
            self._j = 0
        if self._dirty:
            self._dirty = False
            rest = self._live[self._j :]
            self._live = self._dead.live(rest) if len(rest) else rest
            self._j = 0
        if self._j >= len(self._live):
            self._next_chunk()
            if not len(self._live):
                raise StopIteration
        self._last = int(self._live[self._j])
        self._j += 1
        self._handed = True
        return self._last

    def _next_chunk(self) -> None:
        """The next rows in rank order from the unsorted pool: an exact prefix of the pool's
        full order (``order_of`` with ``top`` keeps every tie of its last score)."""
        pool = self._pool
        if len(pool) and not self._pool_clean:
            pool = self._dead.live(pool)
        self._live, self._pool = self._top(
            pool, len(pool) if len(pool) <= 2 * BULK_CHUNK else BULK_CHUNK
        )
        self._pool_clean = True  # what is left of a filtered pool (until ``refilter``)
        self._j = 0

    def walked_in_bulk(self, limit: int | None = None) -> np.ndarray:
        """Rows passed over in bulk mode, in rank order (the first ``limit`` of them): through
        the last row handed out when the pass filled up (``full()``: the rows behind it were
        never reached), else every row ranked after the switch."""
        rows = self._after
        if limit is not None and limit <= 0:
            return rows[:0]
        first = self._first
        if first is not None and limit is not None and (limit <= len(first) or self._first_whole):
            # from the sorted prefix: the walked rows are its rows up to the last one handed
            # out (all of them when that one lies past it), or none if none was
            if self._halted:
                if not self._handed:
                    return rows[:0]
                at = np.flatnonzero(first == self._last)
                if len(at):
                    return first[: min(int(at[0]) + 1, limit)]
            return first[:limit]
        if self._halted:
            rows = self._ranked_after(self._last, rows, False) if self._handed else rows[:0]
        if limit is not None and len(rows) > limit:
            return self._top(rows, limit)[0][:limit]
        return self._sorted(rows)
