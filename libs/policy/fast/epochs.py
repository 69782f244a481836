"""Rank: the pass's order of the queue (scores kept between rank epochs, the queue's book)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from libs.policy import fast as K
from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.fast.walk import Walk, full_walk
from libs.policy.priority import order_of, regime, score_arrays, score_queue_rows
from libs.policy.profiles import ProfileTable
from libs.policy.queue import PendingQueue, QueueArrays
from libs.policy.types import PendingJob, RankResult

ORDER_PREFIX = 256  # rows of the order a pass sorts up front (tests lower it)


def prefix_len(cfg: PolicyConfig, reasons: bool) -> int | None:
    """How much of the order a pass sorts up front: all of it when every job needs a reason,
    else a prefix that does not grow with backfill_depth (a deep walk extends it lazily)."""
    return None if reasons else max(ORDER_PREFIX, 4 * (min(cfg.backfill_depth, 64) + 1))


def rank_pass(
    pending: Sequence[PendingJob],
    q: QueueArrays | None,
    view: ClusterView,
    now: float,
    load: float,
    tenant_usage: Mapping[str, np.ndarray | float],
    profiles: ProfileTable,
    cfg: PolicyConfig,
    top: int | None,
) -> tuple[RankResult, Walk]:
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
        return RankResult(order, scores, terms, reg), full_walk(order, scores, q.enq, tie)
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
        order = order_prefix(scores, enq, top, seq)
        pending.book_reset(order)
        return RankResult(order, scores, terms, reg), full_walk(order, col, enq, seq)
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
        order = order_prefix(col, enq, top, seq)  # the book ran low (or every row is needed)
        pending.book_reset(order)
        return RankResult(order, col.copy(), {}, reg), full_walk(order, col, enq, seq)
    # rank.order is filled by the pass with the rows it walked (schedule, reasons=False)
    # the book is exactly the order's prefix, and the pass (which changes no queue entry) reads
    # it without a copy
    n_book = len(book)
    tail = None if complete else (lambda: order_of(col, enq, None, seq)[n_book:])
    walk = Walk(book, pending.book_row, tail, (col, enq, seq))
    return RankResult(np.zeros(0, dtype=np.int64), col.copy(), {}, reg), walk


def order_prefix(scores: np.ndarray, enq: np.ndarray, top: int | None, seq: np.ndarray):
    """``order_of(scores, enq, top, seq)``: with ``top``, in one compiled call
    (``fast.top_rows``, the same rows and order, ties included) unless a key is NaN."""
    if top is not None and top < len(scores):
        best, _, ok = K.top_rows(np.arange(len(scores)), scores, enq, seq, top)
        if ok:
            return best
    return order_of(scores, enq, top, seq)
