"""One scheduling pass, shared by the live placer and the simulator: rank, place in rank order,
protect the blocked head job with a reservation (EASY backfill), stop when nothing more fits.

The view passed in is UPDATED IN PLACE: every assignment in ``CycleResult.assignments`` has
already been allocated on it (pass ``view.copy()`` for a dry run).

Cheap when the queue is long and the cluster full: a pass stops as soon as no GPU share is free,
jobs whose request exceeds the largest free block are refused by a vectorised pre-check (one
numpy expression per pass, refreshed only when a placement shrinks the largest block), a request
shape that failed is not tried again (the memo lives on the view and survives passes until
something is freed, ``view.freed_gen``: taking resources cannot make a misfit fit), backfill
looks at most ``cfg.backfill_depth`` jobs below the head, and the reservation is only computed
once the walk reaches a job below the head (or when ``want_reservation``), memoised on the view
until the view changes (``view.gen``). When no pending request fits the largest free block at
all, the pass returns at once without ranking (``CycleResult.rank`` is None, every job waits on
"Resources").

Ranking: with ``reasons=False`` only the prefix of the order the pass can reach is sorted
(``priority.order_of(top=...)``; the walk extends it to the full order if it gets that far), and
``CycleResult.rank.order`` holds the rows the pass walked. With a ``PendingQueue`` kept across
passes, scores are kept between rank epochs (``cfg.rerank_interval_s``, a policy choice: the
same live and in the simulator where the caller keeps the queue) and the head of the order is
kept sorted in the queue (its "book"); ``rank.terms`` are filled on a full rank only.

For long replays keep a ``PendingQueue`` (libs.policy.queue) and a ``RunningSet``
(libs.policy.backfill) alive across passes, keep one ``ClusterView`` updated with
``allocate``/``release`` (never rebuilt, so its memos stay warm) and pass ``reasons=False``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from libs.policy import backfill as B
from libs.policy import filters as F
from libs.policy import kernels as K
from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.filters import shape_key
from libs.policy.placement import PlaceContext, place, to_allocation
from libs.policy.priority import order_of, regime, score_arrays, score_queue_rows
from libs.policy.profiles import ProfileTable
from libs.policy.queue import PendingQueue, QueueArrays, take
from libs.policy.scores import SizeMix
from libs.policy.types import (
    CycleResult,
    PendingJob,
    Placement,
    RankResult,
    Refusal,
    Reservation,
    RunningJob,
)
from proto.jobs import HIGH_PRIORITY


def schedule(
    pending: Sequence[PendingJob],
    view: ClusterView,
    running: Sequence[RunningJob] | B.RunningSet,
    *,
    now: float,
    tenant_usage: Mapping[str, np.ndarray | float],
    profiles: ProfileTable,
    cfg: PolicyConfig,
    want_reservation: bool = False,
    reasons: bool = True,
    backfill: bool = True,
    walked_limit: int | None = None,
) -> CycleResult:
    """Start what can start now. ``running`` feeds the reservation (expected ends).

    ``reasons=False`` skips filling ``waiting`` for jobs the pass never looked at (the simulator
    does not need them); jobs that were tried always get their reason, and ``rank.order``
    lists the rows the pass walked (with ``walked_limit``, at least the first
    ``walked_limit`` of them). ``backfill=False``: this
    pass stops at the first job that cannot start (between backfill times, see
    ``PolicyConfig.backfill_interval_s`` and ``libs.policy.cadence``).
    """
    backfill = backfill and cfg.backfill
    load = view.load()
    if not pending:
        return CycleResult([], None, {}, regime(load, cfg))
    is_queue = isinstance(pending, PendingQueue)
    q = None if is_queue else QueueArrays.from_jobs(pending)  # a PendingQueue builds lazily
    max_whole, max_share = K.largest_free(view.whole_free, view.gpu_free)
    if is_queue:
        min_frac, min_whole = pending.min_request(EPS)
        fits_somewhere = min_frac <= max_share + EPS or min_whole <= max_whole + EPS
    else:
        frac = q.gpus < 1.0 - EPS
        fits_somewhere = (frac & (q.gpus <= max_share + EPS)).any() or (
            ~frac & (q.gpus <= max_whole + EPS)
        ).any()
    if not fits_somewhere and not want_reservation:
        # no request fits in the largest free block: nothing can start, skip ranking
        waiting = {p.spec.id: "Resources" for p in pending} if reasons else {}
        return CycleResult([], None, waiting, regime(load, cfg), None)
    # a pass rarely looks past the head job + backfill_depth: order only a prefix unless every
    # job needs a reason (the walk below extends it to the full order if it runs past it)
    # (the prefix does not grow with backfill_depth: a deep walk extends it lazily)
    top = None if reasons else max(_ORDER_PREFIX, 4 * (min(cfg.backfill_depth, 64) + 1))
    rr, walked = _rank(pending, q, view, now, load, tenant_usage, profiles, cfg, top)
    assignments: list[tuple[PendingJob, Placement]] = []
    waiting: dict[str, str] = {}
    ctx: PlaceContext | None = None
    failed = _failed_memo(view, cfg)
    head: PendingJob | None = None  # the blocked job backfill protects
    reservation: Reservation | None = None
    rel: B.RunningSet | None = running if isinstance(running, B.RunningSet) else None
    rel_owned = False  # True once we copied ``running`` into our own RunningSet
    started: list[RunningJob] = []
    behind_head = 0
    reserved_tried = False
    order = rr.order
    stop_at = len(order)
    ever_cache = view.static_cache
    seen: list[int] = []
    resv_fail: set[tuple] = set()  # shapes refused "Reserved" in this pass
    # further blocked jobs protected by their own reservation (Slurm-like, after the head's):
    # the first cfg.reservations - 1 blocked jobs below the head, in rank order
    extra_heads: list[PendingJob] = []
    extras: list[tuple[PendingJob, Reservation]] = []
    n_extra_done = 0
    max_extra = max(0, cfg.reservations - 1)
    slow_fail: set[tuple] = set()  # (shape, slow-model code) refused "SlowGPU" in this pass
    # nodes not reserved (rebuilt when the reservations change) and that mask combined with
    # each slow-model code's (read-only by convention: shared by the rows of the pass)
    resv_held: tuple | None = None
    resv_mask: np.ndarray | None = None
    combined: dict[tuple, np.ndarray] = {}

    def unreserved() -> np.ndarray | None:
        """bool[N], the nodes no reservation of the pass holds (None: no reservation)."""
        nonlocal resv_held, resv_mask
        if reservation is None and not extras:
            return None
        held = (None if reservation is None else reservation.node_index, len(extras))
        if held != resv_held:  # the reserved nodes changed: rebuild the mask once
            resv_held = held
            resv_mask = np.ones(len(view.node_ids), dtype=bool)
            if reservation is not None:
                resv_mask[reservation.node_index] = False
            for _, r in extras:
                resv_mask[r.node_index] = False
            combined.clear()
        return resv_mask

    def screen() -> None:
        """Bulk walk: drop the groups of rows that cannot start now (``_DeadRows.screen``)."""
        dead.screen(view, cfg, unreserved(), shape_specs, shape_keys, failed)
        walked.refilter()

    # slow-guard code per row (bit m: GPU model m too slow for it now), for rows asked only
    codes: _SlowCodes | None = None
    if is_queue:
        shape_of, shape_keys, shape_specs = pending.shapes()
    else:
        shape_of, shape_keys, shape_specs = _shapes_of(pending)
    shape_ids = pending.shape_ids() if is_queue else {k: i for i, k in enumerate(shape_keys)}
    jobs = pending._jobs if is_queue else pending  # plain list access in the hot loop
    # Once the head (and the extra blocked jobs) are known, a row whose shape already failed
    # in this pass changes nothing but its own reason: with reasons=False the walk drops such
    # rows in bulk (``_Walk.skip_dead``). Not with a finite backfill_depth below the queue's
    # length, where every row passed over counts towards the depth.
    can_bulk = (
        _BULK_SKIP and is_queue and not reasons and backfill and cfg.backfill_depth >= len(pending)
    )

    dead: _DeadRows | None = None  # what the bulk walk drops (from the switch on)

    for pos, i in enumerate(walked):
        if max_share < EPS or len(assignments) >= cfg.max_places_per_pass:
            stop_at = pos
            break
        if head is not None:
            if not backfill:
                stop_at = pos
                break
            behind_head += 1
            if behind_head > cfg.backfill_depth:
                stop_at = pos
                break
            # the walk reached a job below the blocked job(s): reserve for them now. When is
            # decided by the walk alone (not by what the memos already know of this job), so
            # a warm view and a cold copy, or the bulk and the row-by-row walk, report the
            # same reservations
            if not reserved_tried:
                reserved_tried = True
                reservation, rel, rel_owned = _reserve(
                    head, view, rel, rel_owned, running, started, now, cfg
                )
            if n_extra_done < len(extra_heads):  # reserve for blocked jobs met since
                rel, rel_owned = _running_set(rel, rel_owned, running, started)
                for h in extra_heads[n_extra_done:]:
                    taken = [r.node_index for _, r in extras]
                    if reservation is not None:
                        taken.append(reservation.node_index)
                    n_run = len(running) + len(started)
                    r = _reserve_extra(h, view, rel, taken, n_run, now, cfg)
                    if r is not None:
                        extras.append((h, r))
                n_extra_done = len(extra_heads)
        if not walked.bulk:
            seen.append(i)
            if can_bulk and head is not None and len(extra_heads) >= max_extra:
                if ctx is None:
                    ctx = _context(pending, q, is_queue, view, profiles, cfg)
                if codes is None:
                    codes = _SlowCodes(pending, q, shape_of, shape_specs, view, ctx, cfg, now)
                dead = _DeadRows(shape_of, shape_specs, codes, len(view.models), view)
                dead.failed_shapes(shape_ids[k] for k in failed if k in shape_ids)
                for k, c in slow_fail:
                    dead.slow_refused(shape_ids[k], c)
                dead.block(max_share, max_whole)
                # late binding on purpose: the walk asks with the pass's current free share
                walked.skip_dead(
                    dead,
                    lambda: max_share < EPS or len(assignments) >= cfg.max_places_per_pass,  # noqa: B023
                    None if walked_limit is None else max(1, walked_limit),
                )
                screen()  # the reservations are made (above): drop what cannot start
        job = jobs[i]
        spec = job.spec
        key = (spec.gpus, spec.gpu_mem_gb, spec.host_mem_gb, spec.cpus, spec.constraints)
        why = failed.get(key)
        g = spec.gpus
        if why is None and (g > max_share + EPS if g < 1.0 - EPS else round(g) > max_whole):
            # scalar pre-check: larger than any free block
            ever = ever_cache.get(("ever", key))
            if ever is None:
                ever = F.can_ever_fit(spec, view)
            if ever:
                why = "Resources"  # else let place() report the precise never-fits reason
        if why is not None:
            waiting[spec.id] = why
            if why == "Resources":
                if head is None:
                    head = job
                elif len(extra_heads) < max_extra:
                    extra_heads.append(job)
            continue
        if ctx is None:
            ctx = _context(pending, q, is_queue, view, profiles, cfg)
        mask = unreserved()
        held = False  # the slow-GPU guard holds some GPU models off for this row
        if spec.est_runtime_s >= cfg.slow_guard_runtime_s:
            if codes is None:
                codes = _SlowCodes(pending, q, shape_of, shape_specs, view, ctx, cfg, now)
            too = codes.row(i)
            if too:
                if (key, too) in slow_fail:  # same shape, same slow models: refused this pass
                    waiting[spec.id] = "SlowGPU"
                    continue
                held = True
                both = combined.get((too, mask is None))
                if both is None:
                    fast = _fast_nodes(too, view)
                    both = combined[(too, mask is None)] = fast if mask is None else mask & fast
                mask = both
        if mask is not None and key in resv_fail:
            # this shape fits nowhere but reserved nodes, where it would delay their jobs
            # (placements in a pass only take resources): only a job ending before some
            # reserved start could still go there
            protected = _protected(head, reservation, extras)
            latest = max(r.start for _, r in protected)
            fastest = min(
                profiles.runtime_s(spec, view.models[view.model_idx[r.node_index]])
                for _, r in protected
            )
            if now + fastest * (1.0 - job.progress) > latest + EPS:
                waiting[spec.id] = "Reserved"
                continue
        res = place(spec, view, profiles, cfg, ctx=ctx, mask=mask)
        if held and isinstance(res, Refusal) and res.reason == "Reserved":
            # it fits somewhere, but only on slow GPUs (or reserved nodes): wait for a fast
            # one; memoised for this pass only (placements in a pass only take resources; the
            # slow set depends on the wait). A "Resources" refusal means it fits on no node at
            # all, slow or fast: that is the same answer the failed-shape memo and the
            # largest-block check give, so it is handled like any other job's below.
            waiting[spec.id] = "SlowGPU"
            slow_fail.add((key, too))
            if dead is not None:
                dead.slow_refused(int(shape_of[i]), too)
                walked.refilter()
            continue
        if isinstance(res, Refusal) and mask is not None and res.reason == "Reserved":
            rel, rel_owned = _running_set(rel, rel_owned, running, started)
            for h, r in _protected(head, reservation, extras):
                res = _try_reserved_node(job, h, r, view, profiles, cfg, ctx, rel, now)
                if isinstance(res, Placement):
                    break
        if isinstance(res, Placement):
            alloc = to_allocation(spec, res, now, job.attempt)
            view.allocate(alloc)
            assignments.append((job, res))
            end = now + profiles.runtime_s(spec, view.models[view.model_idx[res.node_index]]) * (
                1.0 - job.progress
            )
            rj = RunningJob(spec, res.node_index, res.gpu_indices, res.gpu_share, end)
            started.append(rj)
            if rel is not None and rel_owned:
                rel.add(rj)
            max_whole, max_share = K.largest_free(view.whole_free, view.gpu_free)
            if dead is not None:
                dead.block(max_share, max_whole)
                walked.refilter()
            continue
        waiting[spec.id] = res.reason
        if res.reason != "Reserved":
            failed[key] = res.reason
            if dead is not None:
                dead.failed_shapes((int(shape_of[i]),))
                walked.refilter()
        elif not held:
            resv_fail.add(key)
        if res.reason == "Resources":
            if head is None:
                head = job
            elif len(extra_heads) < max_extra:
                extra_heads.append(job)
    if head is not None and reservation is None and want_reservation:
        reservation, rel, rel_owned = _reserve(
            head, view, rel, rel_owned, running, started, now, cfg
        )
    if reasons:
        for i in order[stop_at:]:
            sid = pending[int(i)].spec.id
            if sid not in waiting:
                waiting[sid] = "Priority" if head is not None else "Resources"
    if not reasons:  # the order as far as the pass walked it
        rows = np.array(seen, dtype=np.int64)
        if walked.bulk:
            keep = None if walked_limit is None else max(0, walked_limit - len(rows))
            rows = np.concatenate([rows, walked.walked_in_bulk(keep)])
        rr = RankResult(rows, rr.scores, rr.terms, rr.regime)
    return CycleResult(
        assignments, reservation, waiting, rr.regime, rr, tuple(r for _, r in extras)
    )


_ORDER_PREFIX = 256
_BULK_SKIP = True  # tests turn it off to compare the bulk walk with the row-by-row one
_BULK_CHUNK = 64  # rows the bulk walk sorts at a time


def _full_walk(prefix: np.ndarray, scores: np.ndarray, enq: np.ndarray, tie=None) -> _Walk:
    """The computed prefix, then (only if the pass gets that far) the rest of the full order."""
    n = len(prefix)
    tie = np.arange(len(scores)) if tie is None else tie
    tail = None if n >= len(scores) else (lambda: order_of(scores, enq, None, tie)[n:])
    return _Walk(prefix.tolist(), None, tail, (scores, enq, tie))


class _Walk:
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

    def __iter__(self) -> _Walk:
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
        call (``kernels.top_rows``) or, when a key is NaN, through numpy."""
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
            # (``_DeadRows.screen``), and only the rows left are worth sorting
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
            pool, len(pool) if len(pool) <= 2 * _BULK_CHUNK else _BULK_CHUNK
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


def _rank(
    pending: Sequence[PendingJob],
    q: QueueArrays | None,
    view: ClusterView,
    now: float,
    load: float,
    tenant_usage: Mapping[str, np.ndarray | float],
    profiles: ProfileTable,
    cfg: PolicyConfig,
    top: int | None,
) -> tuple[RankResult, _Walk]:
    """(rank, rows in rank order). ``rank.order`` is the full order when ``top`` is None, else
    the prefix computed up front; the rows iterator goes on past it if the pass gets that far.

    With a ``PendingQueue`` and ``cfg.rerank_interval_s`` > 0, scores are kept per row between
    rank epochs (see ``PolicyConfig.rerank_interval_s``): only jobs queued since the epoch are
    scored, as of the epoch's time, and filed into the queue's book (the sorted head of the
    order), so a pass inside an epoch does not touch the whole queue. ``terms`` are filled on
    a full rank only."""
    kw = {"tenant_usage": tenant_usage, "capacity": view, "cfg": cfg, "profiles": profiles}
    if not isinstance(pending, PendingQueue) or cfg.rerank_interval_s <= 0:
        q = q if q is not None else QueueArrays.from_jobs(pending)
        scores, terms, reg = score_arrays(q, now=now, load=load, **kw)
        tie = pending.seq() if isinstance(pending, PendingQueue) else None
        order = order_of(scores, q.enq, top, tie)
        return RankResult(order, scores, terms, reg), _full_walk(order, scores, q.enq, tie)
    reg = regime(load, cfg)
    key = (reg, id(cfg), id(profiles), tuple(view.models), view.total_gpus())
    epoch = pending.rank_epoch
    col = pending.cached_scores()
    enq, seq = pending.enq(), pending.seq()
    if epoch is None or epoch[1] != key or not epoch[0] <= now < epoch[0] + cfg.rerank_interval_s:
        q = pending.arrays()
        scores, terms, reg = score_arrays(
            q,
            now=now,
            load=load,
            n_tenants=pending.tenant_count(tenant_usage),
            tenants_in_q=pending.tenant_indices(),
            **kw,
        )
        col[:] = scores
        pending.rank_epoch = (now, key)
        order = _order_prefix(scores, enq, top, seq)
        pending.book_reset(order)
        return RankResult(order, scores, terms, reg), _full_walk(order, col, enq, seq)
    new = pending.unscored_rows()
    if len(new):
        n_tenants = pending.tenant_count(tenant_usage)
        col[new] = score_queue_rows(
            pending, new, now=epoch[0], load=load, n_tenants=n_tenants, **kw
        )
        for i in new.tolist():
            pending.book_insert(i)
    book, complete = pending.book()
    if top is None or (not complete and len(book) < top // 2):
        order = _order_prefix(col, enq, top, seq)  # the book ran low (or every row is needed)
        pending.book_reset(order)
        return RankResult(order, col.copy(), {}, reg), _full_walk(order, col, enq, seq)
    # rank.order is filled by the pass with the rows it walked (schedule, reasons=False)
    # the book is exactly the order's prefix, and the pass (which changes no queue entry) reads
    # it without a copy
    n_book = len(book)
    tail = None if complete else (lambda: order_of(col, enq, None, seq)[n_book:])
    walk = _Walk(book, pending.book_row, tail, (col, enq, seq))
    return RankResult(np.zeros(0, dtype=np.int64), col.copy(), {}, reg), walk


def _order_prefix(scores: np.ndarray, enq: np.ndarray, top: int | None, seq: np.ndarray):
    """``order_of(scores, enq, top, seq)``: with ``top``, in one compiled call
    (``kernels.top_rows``, the same rows and order, ties included) unless a key is NaN."""
    if top is not None and top < len(scores):
        best, _, ok = K.top_rows(np.arange(len(scores)), scores, enq, seq, top)
        if ok:
            return best
    return order_of(scores, enq, top, seq)


def _context(pending, q, is_queue: bool, view, profiles, cfg) -> PlaceContext:
    """The pass's ``PlaceContext``, with the size mix of what is queued."""
    fallback = SizeMix.of(cfg.size_mix)
    mix = pending.size_mix(fallback) if is_queue else SizeMix.from_requests(q.gpus, fallback)
    return PlaceContext.build(view, profiles, cfg, mix)


class _DeadRows:
    """Rows the bulk walk may drop (``live`` keeps the others): their shape failed in this pass or
    is larger than the largest free block (and fits some node when empty), or their (shape,
    slow-model code) was refused SlowGPU in this pass. Every one of these facts is about a
    group of rows, (shape, code): ``assign`` puts each candidate row in its group once (the
    codes are fixed for the pass), the pass marks groups dead as it learns, and a check is
    one lookup per row (``dead_g[group_of_row[row]]``)."""

    def __init__(self, shape_of, shape_specs, codes: _SlowCodes, bits: int, view) -> None:
        self.shape_of = shape_of
        self.codes = codes
        self.bits = bits
        # per shape: fractional or not, whole GPUs, ..., GPUs asked (filters.shape_requests)
        self.requests = _per_shape(view, "requests", shape_specs, F.shape_requests)
        self.ever = _per_shape(
            view,
            "ever",
            shape_specs,
            lambda specs: np.array([F.can_ever_fit(sp, view) for sp in specs], dtype=bool),
        )
        self.failed = np.zeros(len(shape_specs), dtype=bool)
        self.too_big = np.zeros(len(shape_specs), dtype=bool)
        self.pairs: set[int] = set()
        self.group_of_row = np.full(len(shape_of), -1, dtype=np.int64)
        self.g_key = np.zeros(0, dtype=np.int64)  # (shape << bits) + code per group, sorted
        self.g_shape = np.zeros(0, dtype=np.int64)
        self.g_code = np.zeros(0, dtype=np.int64)
        self.g_pair = np.zeros(0, dtype=bool)  # the group's (shape, code) was refused
        self.g_nofit = np.zeros(0, dtype=bool)  # the group fits nowhere it may go (screen)
        self._dead_g: np.ndarray | None = np.zeros(0, dtype=bool)  # ``dead_g``, None: stale
        self.all_nodes = np.ones(len(view.node_ids), dtype=bool)

    def assign(self, rows: np.ndarray) -> None:
        """Put ``rows`` in their (shape, code) groups (once per pass, before any check)."""
        # a row whose shape is already dead stays dead for the pass (failed and too-big
        # shapes only grow as resources are taken): its slow-model code does not matter
        shape_dead = self.failed | self.too_big
        self.codes.fill(rows, shape_dead)
        span = len(self.requests) << self.bits
        if span <= _DENSE_KEYS:  # one compiled call: keys, groups, each row's group
            uniq, self.g_shape, self.g_code = K.group_rows(
                rows,
                self.shape_of,
                shape_dead,
                self.codes.cache,
                self.bits,
                span,
                self.group_of_row,
            )
        else:
            keys = K.row_keys(rows, self.shape_of, shape_dead, self.codes.cache, self.bits)
            uniq, inv = np.unique(keys, return_inverse=True)
            self.group_of_row[rows] = inv
            self.g_shape = uniq >> self.bits
            self.g_code = uniq & ((1 << self.bits) - 1)
        self.g_key = uniq
        self.g_pair = (
            np.fromiter((k in self.pairs for k in uniq.tolist()), dtype=bool, count=len(uniq))
            if self.pairs
            else np.zeros(len(uniq), dtype=bool)
        )
        self.g_nofit = np.zeros(len(uniq), dtype=bool)
        self._refresh()

    def screen(self, view, cfg, allowed_nodes, shape_specs, shape_keys, failed) -> None:
        """Mark dead every group that cannot start on the view as it is now: its shape fits
        no node (recorded in ``failed`` as ``place`` would), or, for a group the slow-GPU
        guard holds off some models, it fits no node that is fast enough and not reserved
        (``allowed_nodes``: bool[N] not reserved, or None). Exactly the answer ``place``
        would give each of its rows, for all groups at once: resources only shrink during a
        pass, so a dead group stays dead."""
        gi = np.flatnonzero(~self.dead_g)
        if not len(gi):
            return
        shapes, inv = K.unique_sorted(self.g_shape[gi])  # g_shape is sorted (by g_key)
        static = _per_shape(view, "static_masks", shape_specs, _static_masks(view))
        fits, refused = F.fit_now_shapes(
            shapes, shape_specs, view, cfg, static, self.requests, shape_keys
        )
        if refused:
            for k, w in refused.items():
                failed[shape_keys[k]] = w
            self.failed[list(refused)] = True
        allowed = self.all_nodes if allowed_nodes is None else allowed_nodes
        ok = K.groups_fit(fits, inv, self.g_code[gi], view.model_idx, allowed)
        self.g_nofit[gi[~ok]] = True
        self._refresh()

    def _refresh(self) -> None:
        """The groups' facts changed: ``dead_g`` is recomputed when next read (a pass often
        learns several facts in a row, e.g. a placement's smaller free blocks and a failed
        shape, before it filters rows again)."""
        self._dead_g = None

    @property
    def dead_g(self) -> np.ndarray:
        """bool per group: dead (its shape failed or is too big, its (shape, code) was refused,
        or it fits nowhere it may go)."""
        d = self._dead_g
        if d is None:
            d = self._dead_g = K.dead_groups(
                self.g_shape, self.failed, self.too_big, self.g_pair, self.g_nofit
            )
        return d

    def failed_shapes(self, shape_ids) -> None:
        for s in shape_ids:
            self.failed[s] = True
        self._refresh()

    def slow_refused(self, shape_id: int, code: int) -> None:
        k = (shape_id << self.bits) + code
        self.pairs.add(k)
        g = int(np.searchsorted(self.g_key, k))
        if g < len(self.g_key) and self.g_key[g] == k:
            self.g_pair[g] = True
            if self._dead_g is not None:
                self._dead_g[g] = True

    def block(self, max_share: float, max_whole: int) -> None:
        """The largest free blocks shrank: shapes above them cannot start in this pass."""
        self.too_big = K.too_big(self.requests, self.ever, max_share, max_whole, EPS)
        self._refresh()

    def live(self, rows: np.ndarray) -> np.ndarray:
        """The rows of ``rows`` not dead, in the order given
        (``rows[~dead_g[group_of_row[rows]]]``)."""
        return K.live_rows(rows, self.group_of_row, self.dead_g)


_DENSE_KEYS = 1 << 16  # key spaces up to this size are grouped with a table, not a sort


def _held_nodes(codes: np.ndarray, view: ClusterView) -> np.ndarray:
    """bool[code, node]: the node's GPU model is held by that slow-model code (bit m: model
    m of the view, see ``_hold_waits``)."""
    return ((codes[:, None] >> view.model_idx[None, :]) & 1) == 1


def _fast_nodes(code: int, view: ClusterView) -> np.ndarray:
    """bool[N]: the nodes whose GPU model a slow-model code does not hold (``_held_nodes``'s
    complement), memoised on the view (static: codes and models are fixed). Read-only."""
    key = ("fast_nodes", code)
    hit = view.static_cache.get(key)
    if hit is None:
        hit = view.static_cache[key] = ~_held_nodes(np.array([code]), view)[0]
        hit.setflags(write=False)
    return hit


def _static_masks(view: ClusterView):
    """Builds bool[shape, node]: ``F.static_mask`` of each shape (for ``_per_shape``)."""
    return lambda specs: np.stack([F.static_mask(sp, view) for sp in specs])


def _shapes_of(jobs: Sequence[PendingJob]) -> tuple[np.ndarray, list[tuple], list]:
    """``PendingQueue.shapes()`` for a plain list of jobs."""
    ids: dict[tuple, int] = {}
    specs = []
    rows = []
    for j in jobs:
        k = shape_key(j.spec)
        s = ids.get(k)
        if s is None:
            s = ids[k] = len(ids)
            specs.append(j.spec)
        rows.append(s)
    return np.array(rows, dtype=np.int64), list(ids), specs


class _SlowCodes:
    """The slow-model codes of the queue's rows (bit m: GPU model m of the view is held off for
    now, ``_hold_waits``), computed for the rows asked only (one compiled call per batch: a
    row at a time in the row-by-row walk, all candidates at once in bulk) and kept for the
    pass: a long queue is never scanned whole for it. The part that does not move with
    time (``_hold_waits``: per row and model, how long the job is held) is kept ACROSS passes
    in a ``PendingQueue`` column, so a pass only compares it with each row's wait."""

    def __init__(self, pending, q, shape_of, shape_specs, view, ctx, cfg, now) -> None:
        self.pending, self.q, self.shape_of = pending, q, shape_of
        self.view, self.ctx, self.cfg, self.now = view, ctx, cfg, float(now)
        self.cache = np.full(len(pending), -1, dtype=np.int64)
        self.present = _per_shape(
            view, "present_models", shape_specs, lambda specs: _present_models(specs, view)
        )
        n_models = len(view.models)
        self.no_dead = np.zeros(len(shape_specs), dtype=bool)
        if isinstance(pending, PendingQueue):
            # valid while the profile tables, the config and the nodes' specs are the same
            inputs = (ctx.tables, cfg, view.static_cache)
            self.waits = pending.column("hold_waits", n_models, inputs)
            # per row, the code it got last and the waits it holds between: (code, since,
            # until). A code only changes when a wait crosses one of its thresholds, so a
            # later pass reuses it while since <= wait < until (the same comparisons)
            self.kept = pending.column("slow_code", 3, inputs)
            self.enq = pending.enq()
        else:  # the same columns, kept for this pass only
            self.waits = np.full((len(pending), n_models), np.nan)
            self.kept = np.full((len(pending), 3), np.nan)
            self.enq = q.enq

    def rows(self, rows: np.ndarray) -> np.ndarray:
        self.fill(rows, self.no_dead)
        return self.cache[rows]

    def fill(self, rows: np.ndarray, shape_dead: np.ndarray) -> None:
        """Put the code of each row of ``rows`` whose shape is not dead (``shape_dead``: bool
        per shape) in ``self.cache``."""
        waits = self.waits
        new = K.row_codes(
            rows, self.shape_of, shape_dead, self.cache, self.kept, waits, self.enq, self.now
        )
        if len(new):  # queued since their hold waits were last needed
            present = self.present[self.shape_of[new]]
            if isinstance(self.pending, PendingQueue):
                waits[new] = _hold_waits_of_rows(self.pending, new, present, self.ctx, self.cfg)
            else:
                waits[new] = _hold_waits(take(self.q, new), present, self.ctx, self.cfg)
            K.codes_from_waits(new, waits, self.enq, self.now, self.cache, self.kept)

    def row(self, i: int) -> int:
        c = int(self.cache[i])
        return c if c >= 0 else int(self.rows(np.array([i], dtype=np.int64))[0])


def _per_shape(view: ClusterView, name: str, shape_specs: list, build) -> np.ndarray:
    """``build(shape_specs)``, a static array with one entry per shape, memoised on the view.
    A queue only appends to its shape list (``PendingQueue.shapes``), so the same list object
    with the same length holds the same shapes; anything else is keyed by the shapes."""
    key = (name, id(shape_specs), len(shape_specs))
    hit = view.static_cache.get(key)
    if hit is not None and hit[0] is shape_specs:
        return hit[1]
    full_key = (name, tuple(map(shape_key, shape_specs)))
    arr = view.static_cache.get(full_key)
    if arr is None:
        arr = view.static_cache[full_key] = build(shape_specs)
    view.static_cache[key] = (shape_specs, arr)
    return arr


def _present_models(shape_specs: list, view: ClusterView) -> np.ndarray:
    """bool[shape, model]: some node of that GPU model could hold the shape (static)."""
    n_models = len(view.models)
    present = np.zeros((len(shape_specs), n_models), dtype=bool)
    for s, spec in enumerate(shape_specs):
        key = ("models", shape_key(spec))
        hit = view.static_cache.get(key)
        if hit is None:
            hit = np.zeros(n_models, dtype=bool)
            hit[np.unique(view.model_idx[F.static_mask(spec, view)])] = True
            view.static_cache[key] = hit
        present[s] = hit
    return present


def _hold_waits(
    q: QueueArrays, present: np.ndarray, ctx: PlaceContext, cfg: PolicyConfig
) -> np.ndarray:
    """float[row, model]: the job is held off that model while it has waited less than this
    (-inf: never held). The rule: the slow-GPU guard, the energy guard and the green-job rules
    (see ``PolicyConfig``), for jobs of at least ``slow_guard_runtime_s``. With g the job's
    green tolerance (``scores.green_tolerance``) and loss the extra runtime on a model vs the
    fastest model that can hold it, a model is "worth it" when 1 - energy/energy of the
    fastest >= (1 - green_worth x g) x (1 - speed/fastest speed) (energy per unit of work of
    its class). Held: a slow model (< slow_guard_min_speed x fastest) or a
    slower-and-hungrier one that is not worth it, until the job waited energy_guard_factor x
    loss; another slow model until it waited the loss, except for a green job
    (``scores.is_green``), which takes it at once; and, for a green job that waited less than
    green_wait_s, any model over green_energy_slack x the greenest model's energy.
    ``present``: bool[row, model], that model could hold the row's shape.

    Every hold ends after a wait fixed by the job and the model, so this is computed once per
    queued job and a pass only compares it with the job's wait (``kernels.row_codes``: bit m
    of the slow-model code is ``threshold > waited``; tests/policy/test_slow_codes.py checks
    the codes against the rule written per job). One compiled
    loop per row and model (``kernels.hold_waits``): a pass asks it for the one or two jobs
    queued since the last, where numpy's fixed cost per call was most of the time."""
    return K.hold_waits(
        q.cls,
        q.est,
        q.prog,
        q.prio,
        q.deadline,
        float(HIGH_PRIORITY),
        q.es,
        present,
        ctx.tables.speed,
        ctx.tables.energy_per_work,
        _guard_args(cfg),
    )


def _hold_waits_of_rows(
    pending: PendingQueue, rows: np.ndarray, present: np.ndarray, ctx: PlaceContext, cfg
) -> np.ndarray:
    """``_hold_waits(pending.rows(rows), ...)``, read from the queue's table in place
    (``kernels.hold_waits_table``, the same per-job rule): a pass asks it for the one or two
    jobs queued since the last, and building their columns cost more than the rule."""
    return K.hold_waits_table(
        pending.table(),
        rows,
        float(HIGH_PRIORITY),
        present,
        ctx.tables.speed,
        ctx.tables.energy_per_work,
        _guard_args(cfg),
    )


def _guard_args(cfg: PolicyConfig) -> np.ndarray:
    """The slow/energy guard's and the green rules' settings, in the order the kernels read
    them (``kernels._hold_row``)."""
    return np.array(
        [
            cfg.slow_guard_runtime_s,
            cfg.green_min_tolerance,
            cfg.green_max_runtime_s,
            cfg.green_worth,
            cfg.slow_guard_min_speed,
            cfg.energy_guard_factor,
            cfg.green_energy_slack,
            cfg.green_wait_s,
        ],
        dtype=float,
    )


def _failed_memo(view: ClusterView, cfg: PolicyConfig) -> dict[tuple, str]:
    """Request shape -> why it fits no node, kept on the view ACROSS passes while nothing was
    freed (``view.freed_gen``): taking resources can only make a misfit worse, so the answer
    stays exact. "Reserved" refusals depend on the reservation and are never stored."""
    hit = view.dyn_cache.get("failed")
    if hit is None or hit[0] != view.freed_gen or hit[1] is not cfg:
        hit = (view.freed_gen, cfg, {})
        view.dyn_cache["failed"] = hit
    return hit[2]


def _reserve(
    head: PendingJob,
    view: ClusterView,
    rel: B.RunningSet | None,
    rel_owned: bool,
    running: Sequence[RunningJob] | B.RunningSet,
    started: list[RunningJob],
    now: float,
    cfg: PolicyConfig,
) -> tuple[Reservation | None, B.RunningSet | None, bool]:
    """``backfill.reserve`` for the head, memoised on the view across passes: the same head and
    shape, no change to the view since (``view.gen``; running jobs only start and end through
    allocate/release) and the same number of running jobs give the same reservation, as long
    as its start is not in the past (an overrun job counts as ending ``now``, and a later
    ``now`` can only move starts that were before it)."""
    n_run = len(running) + len(started)
    key = (head.spec.id, shape_key(head.spec), view.gen, n_run, cfg)
    hit = view.dyn_cache.get("reservation")
    if hit is not None and hit[0] == key and (hit[1] is None or hit[1].start >= now):
        return hit[1], rel, rel_owned
    rel, rel_owned = _running_set(rel, rel_owned, running, started)
    res = B.reserve(head.spec.id, head.spec, view, rel, now=now, cfg=cfg)
    view.dyn_cache["reservation"] = (key, res)
    return res, rel, rel_owned


def _protected(
    head: PendingJob | None,
    reservation: Reservation | None,
    extras: list[tuple[PendingJob, Reservation]],
) -> list[tuple[PendingJob, Reservation]]:
    """Every (blocked job, reservation) of the pass, the head's first."""
    out = [(head, reservation)] if head is not None and reservation is not None else []
    return out + extras


def _reserve_extra(
    job: PendingJob,
    view: ClusterView,
    rel: B.RunningSet,
    taken: list[int],
    n_run: int,
    now: float,
    cfg: PolicyConfig,
) -> Reservation | None:
    """``backfill.reserve`` for a blocked job below the head, on a node no earlier
    reservation holds; memoised on the view like the head's (same job, shape, view state,
    running count and taken nodes)."""
    memo = view.dyn_cache.setdefault("reservation_extra", {})
    key = (shape_key(job.spec), view.gen, n_run, tuple(taken), cfg)
    hit = memo.get(job.spec.id)
    if hit is not None and hit[0] == key and (hit[1] is None or hit[1].start >= now):
        return hit[1]
    if len(memo) > 4 * max(1, cfg.reservations):
        memo.clear()  # only the current few blocked jobs matter
    exclude = np.zeros(len(view.node_ids), dtype=bool)
    exclude[taken] = True
    res = B.reserve(job.spec.id, job.spec, view, rel, now=now, cfg=cfg, exclude=exclude)
    memo[job.spec.id] = (key, res)
    return res


def _running_set(
    rel: B.RunningSet | None,
    owned: bool,
    running: Sequence[RunningJob] | B.RunningSet,
    started: list[RunningJob],
) -> tuple[B.RunningSet, bool]:
    """The running jobs plus those started in this pass, without mutating the caller's set
    (owned: ours, to add the pass's later starts to). Nothing started yet: the caller's own
    set, not owned, whose per-node lists and first ends are already built."""
    if owned and rel is not None:
        return rel, True
    if isinstance(running, B.RunningSet) and not started:
        return running, False
    if isinstance(running, B.RunningSet):
        return B.RunningSet(started, base=running), True
    return B.RunningSet([*running, *started]), True


def _try_reserved_node(
    job: PendingJob,
    head: PendingJob | None,
    reservation: Reservation,
    view: ClusterView,
    profiles: ProfileTable,
    cfg: PolicyConfig,
    ctx: PlaceContext,
    rel: B.RunningSet | None,
    now: float,
) -> Placement | Refusal:
    """Backfill onto the reserved node only if it cannot delay the head job."""
    n = reservation.node_index
    only = np.zeros(len(view.node_ids), dtype=bool)
    only[n] = True
    res = place(job.spec, view, profiles, cfg, ctx=ctx, mask=only)
    if not isinstance(res, Placement) or head is None:
        return Refusal("Reserved")
    runtime = profiles.runtime_s(job.spec, view.models[view.model_idx[n]]) * (1.0 - job.progress)
    cand = B.Release(
        now + runtime,
        res.gpu_indices,
        res.gpu_share,
        job.spec.gpu_mem_gb,
        job.spec.host_mem_gb,
        job.spec.cpus,
    )
    if B.delays(
        head.spec, reservation, view, rel.get(n, now) if rel is not None else [], cand, now=now
    ):
        return Refusal("Reserved")
    return res
