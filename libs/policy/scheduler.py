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
when a backfill decision needs it (or when ``want_reservation``), memoised on the view until the
view changes (``view.gen``). When no pending request fits the largest free block at all, the
pass returns at once without ranking (``CycleResult.rank`` is None, every job waits on
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

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from libs.policy import backfill as B
from libs.policy import filters as F
from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.placement import PlaceContext, place, to_allocation
from libs.policy.priority import order_of, regime, score_arrays
from libs.policy.profiles import ProfileTable
from libs.policy.queue import PendingQueue, QueueArrays
from libs.policy.scores import CLASS_INDEX, SizeMix, green_tolerance, is_green
from libs.policy.types import (
    CycleResult,
    PendingJob,
    Placement,
    RankResult,
    Refusal,
    Reservation,
    RunningJob,
)


def _shape(spec) -> tuple:
    return (spec.gpus, spec.gpu_mem_gb, spec.host_mem_gb, spec.cpus, spec.constraints)


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
) -> CycleResult:
    """Start what can start now. ``running`` feeds the reservation (expected ends).

    ``reasons=False`` skips filling ``waiting`` for jobs the pass never looked at (the simulator
    does not need them); jobs that were tried always get their reason.
    """
    load = view.load()
    if not pending:
        return CycleResult([], None, {}, regime(load, cfg))
    is_queue = isinstance(pending, PendingQueue)
    q = None if is_queue else QueueArrays.from_jobs(pending)  # a PendingQueue builds lazily
    max_whole = int(view.whole_free.max()) if len(view.node_ids) else 0
    max_share = float(view.gpu_free.max()) if view.gpu_free.size else 0.0
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
    slow_fail: set[tuple] = set()  # (shape, slow models) refused "SlowGPU" in this pass
    slow_cache: dict = {}  # pass-local memo of _slow_models
    jobs = pending._jobs if is_queue else pending  # plain list access in the hot loop
    for pos, i in enumerate(walked):
        if max_share < EPS or len(assignments) >= cfg.max_places_per_pass:
            stop_at = pos
            break
        if head is not None:
            if not cfg.backfill:
                stop_at = pos
                break
            behind_head += 1
            if behind_head > cfg.backfill_depth:
                stop_at = pos
                break
        seen.append(i)
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
            fallback = SizeMix.of(cfg.size_mix)
            if is_queue:
                mix = pending.size_mix(fallback)
            else:
                mix = SizeMix.from_requests(q.gpus, fallback)
            ctx = PlaceContext.build(view, profiles, cfg, mix)
        if head is not None and reservation is None and not reserved_tried:
            reserved_tried = True  # computed only now that a job behind the head may start
            reservation, rel, rel_owned = _reserve(
                head, view, rel, rel_owned, running, started, now, cfg
            )
        if n_extra_done < len(extra_heads):  # reserve for blocked jobs met since
            rel, rel_owned = _running_set(rel, rel_owned, running, started)
            for h in extra_heads[n_extra_done:]:
                taken = [r.node_index for _, r in extras]
                if reservation is not None:
                    taken.append(reservation.node_index)
                r = _reserve_extra(h, view, rel, taken, len(running) + len(started), now, cfg)
                if r is not None:
                    extras.append((h, r))
            n_extra_done = len(extra_heads)
        mask = None
        if reservation is not None or extras:
            mask = np.ones(len(view.node_ids), dtype=bool)
            if reservation is not None:
                mask[reservation.node_index] = False
            for _, r in extras:
                mask[r.node_index] = False
        slow = None
        if spec.est_runtime_s >= cfg.slow_guard_runtime_s:
            too = _slow_models(job, view, ctx, cfg, now, slow_cache)
            if too is not None:
                if (key, too) in slow_fail:  # same shape, same slow models: refused this pass
                    waiting[spec.id] = "SlowGPU"
                    continue
                slow = slow_cache.get(too)
                if slow is None:
                    slow = slow_cache[too] = np.array(too)[view.model_idx]
                mask = ~slow if mask is None else mask & ~slow
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
        if slow is not None and isinstance(res, Refusal) and res.reason == "Reserved":
            # it fits somewhere, but only on slow GPUs (or reserved nodes): wait for a fast
            # one; memoised for this pass only (placements in a pass only take resources; the
            # slow set depends on the wait). A "Resources" refusal means it fits on no node at
            # all, slow or fast: that is the same answer the failed-shape memo and the
            # largest-block check give, so it is handled like any other job's below.
            waiting[spec.id] = "SlowGPU"
            slow_fail.add((key, too))
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
            max_whole = int(view.whole_free.max())
            max_share = float(view.gpu_free.max())
            continue
        waiting[spec.id] = res.reason
        if res.reason != "Reserved":
            failed[key] = res.reason
        elif slow is None:
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
        rr = RankResult(np.array(seen, dtype=np.int64), rr.scores, rr.terms, rr.regime)
    return CycleResult(
        assignments, reservation, waiting, rr.regime, rr, tuple(r for _, r in extras)
    )


_ORDER_PREFIX = 256


def _walk(prefix: np.ndarray, scores: np.ndarray, enq: np.ndarray, tie=None) -> Iterator[int]:
    """Rows in rank order: the computed prefix, then (only if the pass gets that far) the rest
    of the full order."""
    yield from prefix.tolist()
    if len(prefix) < len(scores):
        yield from order_of(scores, enq, None, tie)[len(prefix) :].tolist()


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
) -> tuple[RankResult, Iterator[int]]:
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
        return RankResult(order, scores, terms, reg), _walk(order, scores, q.enq, tie)
    reg = regime(load, cfg)
    key = (reg, id(cfg), id(profiles), tuple(view.models), view.total_gpus())
    epoch = pending.rank_epoch
    col = pending.cached_scores()
    enq, seq = pending.enq(), pending.seq()
    if epoch is None or epoch[1] != key or not epoch[0] <= now < epoch[0] + cfg.rerank_interval_s:
        q = pending.arrays()
        scores, terms, reg = score_arrays(q, now=now, load=load, **kw)
        col[:] = scores
        pending.rank_epoch = (now, key)
        order = order_of(scores, enq, top, seq)
        pending.book_reset(order)
        return RankResult(order, scores, terms, reg), _walk(order, col, enq, seq)
    new = pending.unscored_rows()
    if len(new):
        sub, _, _ = score_arrays(
            pending.rows(new), now=epoch[0], load=load, present=pending.tenants_present(), **kw
        )
        col[new] = sub
        for i in new.tolist():
            pending.book_insert(i)
    book, complete = pending.book()
    if top is None or (not complete and len(book) < top // 2):
        order = order_of(col, enq, top, seq)  # the book ran low (or every row is needed)
        pending.book_reset(order)
        return RankResult(order, col.copy(), {}, reg), _walk(order, col, enq, seq)
    # rank.order is filled by the pass with the rows it walked (schedule, reasons=False)
    walk = _walk_book(list(book), pending.position, complete, col, enq, seq)
    return RankResult(np.zeros(0, dtype=np.int64), col.copy(), {}, reg), walk


def _walk_book(book, pos, complete, col, enq, seq) -> Iterator[int]:
    """Rows of the book (a snapshot: the pass does not change the queue), then, if the pass
    gets past it, the rest of the full order (the book is exactly its prefix)."""
    for k in book:
        yield pos(k[3])
    if not complete:
        yield from order_of(col, enq, None, seq)[len(book) :].tolist()


def _slow_models(
    job: PendingJob,
    view: ClusterView,
    ctx: PlaceContext,
    cfg: PolicyConfig,
    now: float,
    cache: dict,
) -> tuple[bool, ...] | None:
    """Per GPU model of the view: not to be used by this long job right now, or None when every
    model may be (see ``PolicyConfig``: slow-GPU guard, energy guard, green jobs). With g the
    job's green tolerance and loss the extra runtime there vs the fastest model that can hold
    it, a model is "worth it" when 1 - energy/energy of the fastest >= (1 - green_worth x g) x
    (1 - speed/fastest speed) (energy per unit of work of its class). Held: a slow model
    (< slow_guard_min_speed x fastest) or a slower-and-hungrier one that is not worth it, until
    the job waited energy_guard_factor x loss; another slow model until it waited the loss,
    except for a green job (``scores.is_green``), which takes it at once; and, for a green job
    that waited less than green_wait_s, any model over green_energy_slack x the greenest
    model's energy. Plain Python over the few models; ``cache`` (one pass) keeps the speeds
    and energies per (shape, class)."""
    spec = job.spec
    ck = (_shape(spec), spec.workload_class)
    hit = cache.get(ck)
    if hit is None:
        cls_i = CLASS_INDEX.get(spec.workload_class, CLASS_INDEX["other"])
        speed = ctx.tables.speed[:, cls_i].tolist()
        epw = ctx.tables.energy_per_work[:, cls_i].tolist()
        present = sorted(set(view.model_idx[F.static_mask(spec, view)].tolist()))
        fast = max(present, key=lambda m: speed[m], default=None)
        greenest = min((epw[m] for m in present), default=None)
        hit = cache[ck] = (speed, epw, fast, greenest)
    speed, epw, fast, greenest = hit
    if fast is None:
        return None
    best, e_fast = speed[fast], epw[fast]
    rem = spec.est_runtime_s * max(0.0, 1.0 - job.progress)
    waited = now - job.enqueued_at
    floor = cfg.slow_guard_min_speed * best
    green = is_green(spec, cfg)
    tol = green_tolerance(spec)
    hungry = green and waited < cfg.green_wait_s
    too = []
    for sp, e in zip(speed, epw, strict=True):
        loss = rem / sp - rem / best
        # the energy saved is worth the time lost, for this job's tolerance
        worth = 1.0 - e / e_fast >= (1.0 - cfg.green_worth * tol) * (1.0 - sp / best)
        if (sp < floor or (sp < best and e > e_fast)) and not worth:
            hold = cfg.energy_guard_factor * loss > waited
        elif sp < floor:
            hold = not green and loss > waited
        else:
            hold = False
        too.append(hold or (hungry and e > cfg.green_energy_slack * greenest))
    return tuple(too) if any(too) else None


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
    key = (head.spec.id, _shape(head.spec), view.gen, n_run, cfg)
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
    key = (_shape(job.spec), view.gen, n_run, tuple(taken), cfg)
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
    """The running jobs plus those started in this pass, without mutating the caller's set."""
    if owned and rel is not None:
        return rel, True
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
