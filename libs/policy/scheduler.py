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
from libs.policy import fast as K
from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.fast import epochs as R
from libs.policy.gang_pass import may_start as gang_may_start
from libs.policy.priority import regime
from libs.policy.profiles import ProfileTable
from libs.policy.queue import PendingQueue, QueueArrays
from libs.policy.stages.heat import HeatMemory
from libs.policy.step import Pass
from libs.policy.types import CycleResult, PendingJob, RankResult, RunningJob


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
    heat_memory: HeatMemory | None = None,
    high_hold: np.ndarray | None = None,
) -> CycleResult:
    """Start what can start now. ``running`` feeds the reservation (expected ends).

    ``reasons=False`` skips filling ``waiting`` for jobs the pass never looked at (the simulator
    does not need them); jobs that were tried always get their reason, and ``rank.order``
    lists the rows the pass walked (with ``walked_limit``, at least the first
    ``walked_limit`` of them). ``heat_memory``: how long each job waited for heat
    (``stages.heat``; none: nobody has). ``backfill=False``: this
    pass stops at the first job that cannot start (between backfill times, see
    ``PolicyConfig.backfill_interval_s`` and ``libs.policy.cadence``). ``high_hold``:
    GPUs per model kept for high-priority jobs (``stages.hold``; None: none).

    The stages, in order: rank (``priority``; scores kept between epochs, ``fast.epochs``),
    then per row in that order (``step.Pass.try_row``) filter, guard, score and pick
    (``placement.place``), reserve/backfill for the blocked jobs (``backfill``,
    ``fast.reservations``); from the bulk switch on the walk drops dead rows at once
    (``fast.walk``, ``fast.screen``).
    """
    backfill = backfill and cfg.backfill
    load = view.load()
    if not pending:
        return CycleResult([], None, {}, regime(load, cfg))
    q = None if isinstance(pending, PendingQueue) else QueueArrays.from_jobs(pending)
    max_whole, max_share = K.largest_free(view.whole_free, view.gpu_free)
    if (
        not _fits_somewhere(pending, q, max_whole, max_share)
        and not want_reservation
        and not gang_may_start(pending, q, view)
    ):
        # no request fits in the largest free block: nothing can start, skip ranking
        waiting = {p.spec.id: "Resources" for p in pending} if reasons else {}
        return CycleResult([], None, waiting, regime(load, cfg), None)
    top = R.prefix_len(cfg, reasons)
    rr, walked = R.rank_pass(pending, q, view, now, load, tenant_usage, profiles, cfg, top)
    p = Pass(
        pending, q, view, running, walked, now=now, profiles=profiles, cfg=cfg,
        backfill=backfill, reasons=reasons, max_free=(max_whole, max_share),
        heat_memory=heat_memory, high_hold=high_hold,
    )  # fmt: skip
    stop_at = len(rr.order)
    step_behind, try_row, seen = p.behind_head_step, p.try_row, p.seen
    assigned, cap = p.assignments, cfg.max_places_per_pass
    for pos, i in enumerate(walked):
        # p.full(), spelt out: this runs once per walked row
        full = p.max_share < EPS or len(assigned) >= cap
        if full or (p.head is not None and not step_behind()):
            stop_at = pos
            break
        if not walked.bulk:
            seen.append(i)
            if p.can_bulk and p.head is not None:
                p.maybe_bulk(walked_limit)
        try_row(i)
    if p.head is not None and p.reservation is None and want_reservation:
        p.reserve_head()
    waiting = p.waiting
    if reasons:
        for i in rr.order[stop_at:]:
            sid = pending[int(i)].spec.id
            if sid not in waiting:
                waiting[sid] = "Priority" if p.head is not None else "Resources"
    else:  # the order as far as the pass walked it
        rows = np.array(p.seen, dtype=np.int64)
        if walked.bulk:
            keep = None if walked_limit is None else max(0, walked_limit - len(rows))
            rows = np.concatenate([rows, walked.walked_in_bulk(keep)])
        rr = RankResult(rows, rr.scores, rr.terms, rr.regime)
    extras = tuple(r for _, r in p.extras)
    return CycleResult(p.assignments, p.reservation, waiting, rr.regime, rr, extras)


def _fits_somewhere(pending, q: QueueArrays | None, max_whole: int, max_share: float) -> bool:
    """Some pending request fits in the largest free block (whole GPUs or a share of one)."""
    if q is None:
        min_frac, min_whole = pending.min_request(EPS)
        return min_frac <= max_share + EPS or min_whole <= max_whole + EPS
    frac = q.gpus < 1.0 - EPS
    return bool(
        (frac & (q.gpus <= max_share + EPS)).any() or (~frac & (q.gpus <= max_whole + EPS)).any()
    )
