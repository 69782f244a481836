"""The pending queue as numpy columns, kept up to date incrementally.

Why: ranking reads eight numbers per job; pulling them out of Python objects costs O(queue) on
every pass, which dominates a long replay (a pass per arrival/finish event, thousands of jobs
waiting). ``PendingQueue`` stores the columns once per job (``add``/``remove`` are O(1):
removal swaps the last row in) and behaves as a ``Sequence[PendingJob]``, so ``rank`` and
``schedule`` take either it or a plain list (from which ``QueueArrays.from_jobs`` builds the
columns each time).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from libs.policy.filters import shape_key
from libs.policy.queue_arrays import COLUMNS, QueueArrays, row_of
from libs.policy.scores import SizeMix
from libs.policy.types import PendingJob

_NO_ROWS = np.zeros(0, dtype=np.int64)
_NO_ROWS.setflags(write=False)


class PendingQueue(Sequence[PendingJob]):
    """Incrementally maintained queue. Not thread-safe; one owner mutates it."""

    def __init__(self, jobs: Sequence[PendingJob] = ()) -> None:
        self._jobs: list[PendingJob] = []
        self._pos: dict[str, int] = {}
        self._tenants: dict[str, int] = {}
        self._tenant_names: list[str] = []  # by tenant index: ``QueueArrays.tenants`` (shared)
        self._data = np.zeros((max(16, len(jobs)), len(COLUMNS)))
        # cached priority score per row (NaN = not scored since added); owned by the scheduler's
        # rank epochs (libs.policy.scheduler), moved with its row
        self._score = np.full(len(self._data), np.nan)
        self.rank_epoch: tuple | None = None  # (time, key) of the last full rank
        # histogram of request sizes (scores.SizeMix.size_code), kept in step with the rows
        self._size_counts = np.zeros(64, dtype=np.int64)
        self._sizes: dict[float, int] = {}  # exact request size -> jobs (for min_request)
        self._min_req: tuple | None = None  # (eps, min_request(eps)) until a size comes or goes
        self._mix: tuple | None = None  # (fallback, size_mix) until the histogram changes
        # insertion sequence per row (rank tie-break that survives row swaps), rows to score
        self._seq = np.zeros(len(self._data))
        self._next_seq = 0
        self._unscored: set[str] = set()
        # the "book": sorted (-score, enq, seq) of every queued job whose key is at most
        # ``_floor`` (all jobs when ``_floor`` is None), kept across passes of one rank epoch so
        # a pass reads the head of the order without touching the whole queue; a key names its
        # row through the insertion sequence (unique per entry: ``_row_of_seq``)
        self._book: list[tuple] = []
        self._floor: tuple | None = None
        self._row_of_seq: dict[float, int] = {}
        self._tenant_jobs: dict[int, int] = {}  # tenant index -> queued jobs
        self._present_names: set[str] = set()  # tenants with queued jobs
        # request shape per row (an index into ``_shape_keys``): the scheduler skips the rows
        # of shapes it already knows cannot start, in bulk (libs.policy.scheduler)
        self._shape = np.zeros(len(self._data), dtype=np.int64)
        self._shape_ids: dict[tuple, int] = {}
        self._shape_keys: list[tuple] = []
        self._shape_specs: list = []  # one spec of each shape (static fit is the shape's)
        # per-row caches the scheduler owns (``column``): name -> [float array, key]
        self._cols: dict[str, list] = {}
        # bumped by every add, replace and removal: a memo of the rows keys on it
        # (``fast.plans.GrowMemo``, ``fast.short_due.ShortDue``)
        self.version = 0
        for j in jobs:
            self.add(j)

    def __len__(self) -> int:
        return len(self._jobs)

    def __getitem__(self, i):  # type: ignore[override]
        return self._jobs[i]

    def jobs(self) -> list[PendingJob]:
        """The queued jobs by row, the queue's own list (read-only by convention)."""
        return self._jobs

    def __iter__(self) -> Iterator[PendingJob]:
        return iter(self._jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._pos

    def position(self, job_id: str) -> int:
        """The row of a queued job (KeyError if absent)."""
        return self._pos[job_id]

    def get(self, job_id: str) -> PendingJob | None:
        i = self._pos.get(job_id)
        return None if i is None else self._jobs[i]

    def add(self, job: PendingJob) -> None:
        """Add (or replace, keeping its row) a job."""
        self.version += 1
        jid = job.spec.id
        i = self._pos.get(jid)
        if i is None:
            i = len(self._jobs)
            if i == len(self._data):
                self._data = np.concatenate([self._data, np.zeros_like(self._data)])
                self._score = np.concatenate([self._score, np.full(len(self._score), np.nan)])
                self._seq = np.concatenate([self._seq, np.zeros_like(self._seq)])
                self._shape = np.concatenate([self._shape, np.zeros_like(self._shape)])
                for col in self._cols.values():
                    col[0] = np.concatenate([col[0], np.full_like(col[0], np.nan)])
            self._jobs.append(job)
            self._pos[jid] = i
            self._seq[i] = self._next_seq
            self._row_of_seq[float(self._next_seq)] = i
            self._next_seq += 1
        else:
            self._count(self._jobs[i], -1)
            self._book_discard(i)
            self._jobs[i] = job
        self._data[i] = row_of(job, self._tenants)
        if len(self._tenants) > len(self._tenant_names):  # a new tenant: its index is the next
            self._tenant_names.append(job.spec.tenant)
        key = shape_key(job.spec)
        sid = self._shape_ids.get(key)
        if sid is None:
            sid = self._shape_ids[key] = len(self._shape_keys)
            self._shape_keys.append(key)
            self._shape_specs.append(job.spec)
        self._shape[i] = sid
        self._score[i] = np.nan
        for col in self._cols.values():
            col[0][i] = np.nan
        self._unscored.add(jid)
        self._count(job, +1)

    def remove(self, job_id: str) -> PendingJob:
        """Remove a job by id (KeyError if absent): the last row moves into its place."""
        i = self._pos.pop(job_id)
        self.version += 1
        job = self._jobs[i]
        self._count(job, -1)
        self._book_discard(i)
        self._unscored.discard(job_id)
        del self._row_of_seq[float(self._seq[i])]
        last = len(self._jobs) - 1
        if i != last:
            moved = self._jobs[last]
            self._jobs[i] = moved
            self._pos[moved.spec.id] = i
            self._row_of_seq[float(self._seq[last])] = i
            self._data[i] = self._data[last]
            self._score[i] = self._score[last]
            self._seq[i] = self._seq[last]
            self._shape[i] = self._shape[last]
            for col in self._cols.values():
                col[0][i] = col[0][last]
        self._jobs.pop()
        return job

    def _count(self, job: PendingJob, d: int) -> None:
        g = job.spec.gpus
        self._count_size(g, d)
        n = self._sizes.get(g, 0) + d
        if n == d or not n:  # a size appears or goes: the smallest requests may change
            self._min_req = None
        if n:
            self._sizes[g] = n
        else:
            del self._sizes[g]
        t = self._tenants[job.spec.tenant]
        m = self._tenant_jobs.get(t, 0) + d
        if m:
            self._tenant_jobs[t] = m
            self._present_names.add(job.spec.tenant)
        else:
            del self._tenant_jobs[t]
            self._present_names.discard(job.spec.tenant)

    def min_request(self, eps: float = 1e-9) -> tuple[float, float]:
        """(smallest fractional request, smallest whole-GPU request), inf when none: the
        scheduler's "can anything fit at all" check (memoised until a request size comes or
        goes)."""
        hit = self._min_req
        if hit is None or hit[0] != eps:
            frac = [g for g in self._sizes if g < 1.0 - eps]
            whole = [g for g in self._sizes if g >= 1.0 - eps]
            out = (min(frac, default=float("inf")), min(whole, default=float("inf")))
            hit = self._min_req = (eps, out)
        return hit[1]

    def tenants_present(self) -> np.ndarray:
        """bool per tenant index (``arrays().tenants``): has at least one queued job."""
        out = np.zeros(len(self._tenants), dtype=bool)
        if self._tenant_jobs:
            out[list(self._tenant_jobs)] = True
        return out

    def tenant_indices(self) -> list[int]:
        """The tenant indices (``tenant_names``) of the queued jobs, each once."""
        return list(self._tenant_jobs)

    def tenant_count(self, usage: Mapping[str, object]) -> int:
        """Tenants with queued jobs or in ``usage``: the fair-share term's tenant count
        (``priority.tenant_count``), from the kept set of queued tenants in C-level set
        operations instead of a Python step per tenant."""
        return len(usage.keys() | self._present_names)

    def rows(self, rows: np.ndarray) -> QueueArrays:
        """``arrays()`` restricted to ``rows`` without building the full columns."""
        return QueueArrays.of_table(self._data[rows], self._tenant_names)

    def table(self) -> np.ndarray:
        """float[row, column], the queued jobs' numbers in ``COLUMNS`` order (a read-only
        view by convention)."""
        return self._data[: len(self._jobs)]

    def tenant_names(self) -> list[str]:
        """Tenant names by the index the table's tenant column holds (shared, read-only)."""
        return self._tenant_names

    def unscored_rows(self) -> np.ndarray:
        """Rows added (or replaced) since the scheduler last scored them (then marked scored:
        the caller writes their scores into ``cached_scores``)."""
        if not self._unscored:  # most passes: nothing joined since the last
            return _NO_ROWS
        rows = np.array(sorted(self._pos[j] for j in self._unscored), dtype=np.int64)
        self._unscored.clear()
        return rows

    def shapes(self) -> tuple[np.ndarray, list[tuple], list]:
        """(shape index per row, the shapes, a spec of each): ``shape_key`` of each queued
        job's spec. Shapes are never forgotten (a trace has tens of them), so an index keeps
        its meaning."""
        return self._shape[: len(self._jobs)], self._shape_keys, self._shape_specs

    def shape_ids(self) -> dict[tuple, int]:
        """``shape_key`` -> its index in ``shapes()`` (read-only)."""
        return self._shape_ids

    def seq(self) -> np.ndarray:
        """Insertion sequence per row (read-only view): the rank tie-break."""
        return self._seq[: len(self._jobs)]

    def row_of_seq(self, seq: float) -> int | None:
        """The row of the queued job with insertion sequence ``seq`` (``seq()``), None once it
        left: how a memo that keeps rows across swaps finds one again (``fast.short_due``)."""
        return self._row_of_seq.get(seq)

    # --- the book (see __init__); maintained by libs.policy.scheduler ---------------------
    def _key(self, i: int) -> tuple:
        return (-float(self._score[i]), float(self._data[i, 2]), float(self._seq[i]))

    def book_reset(self, rows: np.ndarray) -> None:
        """The book becomes ``rows`` (a prefix of the full order, best first)."""
        self._book = list(
            zip(
                (-self._score[rows]).tolist(),
                self._data[rows, 2].tolist(),
                self._seq[rows].tolist(),
                strict=True,
            )
        )
        self._floor = self._book[-1] if len(rows) < len(self._jobs) and self._book else None
        self._unscored.clear()

    def book_insert(self, i: int) -> None:
        """Row ``i`` was (re)scored: file it if it belongs to the book's prefix."""
        k = self._key(i)
        if self._floor is None or k < self._floor:
            bisect.insort(self._book, k)

    def _book_discard(self, i: int) -> None:
        """Take row ``i`` out of the book if it is there (its key is its score, enqueue time and
        sequence as filed: a row is rescored only after it left the book)."""
        book = self._book
        if self._jobs[i].spec.id in self._unscored:
            return
        if self._score[i] != self._score[i]:  # a NaN score sorts nowhere: find it by its
            seq = float(self._seq[i])  # sequence
            for j, b in enumerate(book):
                if b[2] == seq:
                    del book[j]
                    return
            return
        k = self._key(i)
        j = bisect.bisect_left(book, k)
        if j < len(book) and book[j] == k:
            del book[j]

    def book_row(self, key: tuple) -> int:
        """The row of the job a book key names."""
        return self._row_of_seq[key[2]]

    def book(self) -> tuple[list[tuple], bool]:
        """(sorted keys, complete): complete when every queued job is in it."""
        return self._book, self._floor is None

    def enq(self) -> np.ndarray:
        """Enqueue times per row (a read-only view)."""
        return self._data[: len(self._jobs), 2]

    def _count_size(self, gpus: float, d: int) -> None:
        c = SizeMix.size_code(gpus)
        if c >= len(self._size_counts):
            grown = np.zeros(2 * c, dtype=np.int64)
            grown[: len(self._size_counts)] = self._size_counts
            self._size_counts = grown
        self._size_counts[c] += d
        self._mix = None

    def size_mix(self, fallback: SizeMix) -> SizeMix:
        """``SizeMix.from_requests`` of the queued requests, from the kept histogram (O(1)),
        memoised until a job joins or leaves (most passes see the queue of the last one)."""
        hit = self._mix
        if hit is None or hit[0] is not fallback:
            hit = self._mix = (fallback, SizeMix.from_code_counts(self._size_counts, fallback))
        return hit[1]

    def cached_scores(self) -> np.ndarray:
        """The scheduler's cached score per row (a writable view; NaN = not yet scored)."""
        return self._score[: len(self._jobs)]

    def column(self, name: str, width: int, key: tuple) -> np.ndarray:
        """A per-row cache owned by the caller: float[len, width], NaN where not yet filled,
        moved with its row, cleared for a row that is added or replaced, and cleared whole
        when ``key`` differs from the last call's (its items compared with ``is``: the
        objects the cached values were computed from). A writable view."""
        col = self._cols.get(name)
        stale = col is None or col[0].shape[1] != width or len(col[1]) != len(key)
        if not stale:
            for a, b in zip(col[1], key, strict=True):  # a plain loop: a few calls per pass
                if a is not b:
                    stale = True
                    break
        if stale:
            col = self._cols[name] = [np.full((len(self._data), width), np.nan), key]
        return col[0][: len(self._jobs)]

    def arrays(self) -> QueueArrays:
        return QueueArrays.of_table(self.table(), self._tenant_names)
