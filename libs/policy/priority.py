"""Rank, as the pass and the scorer call it: the priority score of every queued job and the
order of the queue, computed by the compiled loops of ``fast.rank``. The rules themselves (the
formula, the regimes, the order) are written in ``libs.policy.stages.rank``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from libs.policy import fast as K
from libs.policy.cluster import RESOURCES
from libs.policy.config import PolicyConfig
from libs.policy.daynight import kind_boost
from libs.policy.profiles import ProfileTable
from libs.policy.queue import COLUMNS, PendingQueue, QueueArrays
from libs.policy.stages.burst import service_boost
from libs.policy.stages.rank import TERMS, order_of, regime, regime_weights, score_settings
from libs.policy.types import PendingJob, RankResult
from proto.jobs import WORKLOAD_CLASSES

_TENANT_COLUMN = COLUMNS.index("tenant")
_INFERENCE_COLUMN = COLUMNS.index("inference")


def usage_vector(usage: np.ndarray | float) -> np.ndarray:
    """A tenant's usage in ``RESOURCES`` order; a bare number means GPUs only."""
    if isinstance(usage, (int, float, np.floating, np.integer)):
        v = np.zeros(len(RESOURCES))
        v[0] = float(usage)
        return v
    v = np.asarray(usage, dtype=float)
    if v.shape != (len(RESOURCES),):
        raise ValueError(f"tenant usage must be a number or {len(RESOURCES)} values {RESOURCES}")
    return v


def dominant_share(usage: np.ndarray | float, capacity: np.ndarray) -> float:
    """DRF: the largest share of any resource this usage holds (resources with 0 capacity skip).
    The loop the priority score uses (``fast.dominant_shares``)."""
    return dominant_shares({"": usage}, capacity)[""]


def dominant_shares(
    tenant_usage: Mapping[str, np.ndarray | float], capacity: np.ndarray
) -> dict[str, float]:
    """``dominant_share`` of each tenant, in one compiled loop."""
    cap = np.asarray(capacity, dtype=float)
    if cap.shape != (len(RESOURCES),):
        raise ValueError(f"capacity must be {len(RESOURCES)} totals {RESOURCES}")
    if not tenant_usage:
        return {}
    shares = K.dominant_shares(_usage_matrix(list(tenant_usage.values())), cap)
    return dict(zip(tenant_usage, shares.tolist(), strict=True))


def _usage_matrix(usages: Sequence[np.ndarray | float]) -> np.ndarray:
    """float[T, len(RESOURCES)], one row per usage (a bare number = GPUs only)."""
    width = len(RESOURCES)
    if all(type(u) is np.ndarray and u.shape == (width,) for u in usages):
        return np.array(usages, dtype=float)
    if all(isinstance(u, (int, float)) for u in usages):
        m = np.zeros((len(usages), width))
        m[:, 0] = usages
        return m
    return np.array([usage_vector(u) for u in usages], dtype=float).reshape(-1, width)


def tenants_present(q: QueueArrays) -> np.ndarray:
    """bool per index of ``q.tenants``: has at least one job in ``q``."""
    if len(q.tenants) and len(q.tenant):
        return np.bincount(q.tenant, minlength=len(q.tenants)) > 0
    return np.zeros(len(q.tenants), dtype=bool)


def tenant_dominant_shares(
    q: QueueArrays, tenant_usage: Mapping[str, np.ndarray | float], capacity: np.ndarray
) -> np.ndarray:
    """float per index of ``q.tenants``: the dominant share (``dominant_share``) of each tenant
    with a job in ``q`` (0 for a tenant without usage, and for the others), in one compiled
    loop (``fast.dominant_shares``)."""
    return _shares_by_index(set(q.tenant.tolist()), q.tenants, tenant_usage, capacity)


def _shares_by_index(
    indices: Iterable[int],
    names: Sequence[str],
    tenant_usage: Mapping[str, np.ndarray | float],
    capacity: np.ndarray,
) -> np.ndarray:
    """float per index of ``names``: the dominant share of each of ``indices`` that has
    usage, 0 elsewhere."""
    dom = np.zeros(len(names))
    used = [k for k in indices if names[k] in tenant_usage]
    if used:
        u = _usage_matrix([tenant_usage[names[k]] for k in used])
        dom[used] = K.dominant_shares(u, np.asarray(capacity, dtype=float))
    return dom


def tenant_count(
    q: QueueArrays,
    tenant_usage: Mapping[str, np.ndarray | float],
    present: np.ndarray | None = None,
) -> int:
    """The number of tenants the fair-share term counts: those with usage or queued jobs
    (``present``: bool per index of ``q.tenants``, default the tenants of ``q``'s rows). A
    caller that keeps the queue knows it already (``PendingQueue.tenant_count``)."""
    if present is None:
        present = tenants_present(q)
    return len(tenant_usage) + sum(
        1 for k in np.flatnonzero(present).tolist() if q.tenants[k] not in tenant_usage
    )


def _capacity_and_models(capacity: Any, models: Sequence[str] | None) -> tuple[np.ndarray, list]:
    if hasattr(capacity, "capacity") and hasattr(capacity, "models"):
        return capacity.capacity(), list(models if models is not None else capacity.models)
    cap = np.asarray(capacity, dtype=float)
    if cap.ndim == 0:
        cap = np.array([float(cap), 0.0, 0.0, 0.0])
    if cap.shape != (len(RESOURCES),):
        raise ValueError(f"capacity must be a ClusterView, a GPU count or {RESOURCES} totals")
    return cap, list(models or ())


def best_speed_per_class(profiles: ProfileTable, models: Sequence[str]) -> np.ndarray:
    """float[len(WORKLOAD_CLASSES)]: the fastest speed among ``models`` (1.0 if none given)."""
    if not models:
        return np.ones(len(WORKLOAD_CLASSES))
    return profiles.best_speed(tuple(models))  # memoised on the table (it never changes)


def rank(
    jobs: Sequence[PendingJob],
    *,
    now: float,
    load: float,
    tenant_usage: Mapping[str, np.ndarray | float],
    capacity: Any,
    cfg: PolicyConfig,
    profiles: ProfileTable,
    models: Sequence[str] | None = None,
) -> RankResult:
    """Score and order ``jobs`` (best first).

    ``capacity``: a ``ClusterView`` (its totals and GPU models are used), or totals in
    ``RESOURCES`` order, or a GPU count. ``tenant_usage``: per tenant, usage in ``RESOURCES``
    order or a GPU count. ``models``: GPU models present (for the fastest-GPU runtime in urgency).
    """
    if len(jobs) == 0:
        empty = np.zeros(0)
        reg = regime(load, cfg)
        return RankResult(np.zeros(0, dtype=np.int64), empty, {t: empty for t in TERMS}, reg)
    return rank_arrays(
        QueueArrays.from_jobs(jobs),
        now=now,
        load=load,
        tenant_usage=tenant_usage,
        capacity=capacity,
        cfg=cfg,
        profiles=profiles,
        models=models,
    )


def rank_arrays(
    q: QueueArrays,
    *,
    now: float,
    load: float,
    tenant_usage: Mapping[str, np.ndarray | float],
    capacity: Any,
    cfg: PolicyConfig,
    profiles: ProfileTable,
    models: Sequence[str] | None = None,
) -> RankResult:
    """``rank`` on queue columns (see ``libs.policy.queue``)."""
    scores, terms, reg = score_arrays(
        q,
        now=now,
        load=load,
        tenant_usage=tenant_usage,
        capacity=capacity,
        cfg=cfg,
        profiles=profiles,
        models=models,
    )
    return RankResult(order_of(scores, q.enq), scores, terms, reg)


def score_arrays(
    q: QueueArrays,
    *,
    now: float,
    load: float,
    tenant_usage: Mapping[str, np.ndarray | float],
    capacity: Any,
    cfg: PolicyConfig,
    profiles: ProfileTable,
    models: Sequence[str] | None = None,
    present: np.ndarray | None = None,
    n_tenants: int | None = None,
    tenants_in_q: Iterable[int] | None = None,
) -> tuple[np.ndarray, dict[str, np.ndarray], str]:
    """(scores, terms, regime) of the rows of ``q``. ``present`` (bool per tenant index): the
    tenants of the whole queue, when ``q`` is a subset of it (the fair share's tenant count,
    ``tenant_count``), or ``n_tenants``, that count itself. ``tenants_in_q``: the distinct
    tenant indices of ``q``'s rows, when the caller keeps them (``PendingQueue.
    tenant_indices``), instead of a scan of the rows.

    The arithmetic is one compiled loop over the rows (``fast.priority_terms``, checked
    against its definition, ``stages.rank.priority_terms``): a pass scores the one or two jobs
    queued since the last, and a dozen numpy calls on one row cost ten times the loop."""
    cap, mods = _capacity_and_models(capacity, models)
    reg, w = regime_weights(load, cfg)
    if len(q.tenant) == 0:
        empty = np.zeros(0)
        return empty, {t: empty for t in TERMS}, reg
    n = max(tenant_count(q, tenant_usage, present) if n_tenants is None else n_tenants, 1)
    out = K.priority_terms(
        q.prio,
        q.es,
        q.enq,
        q.est,
        q.prog,
        q.deadline,
        q.cls,
        q.tenant,
        tenant_dominant_shares(q, tenant_usage, cap)
        if tenants_in_q is None
        else _shares_by_index(tenants_in_q, q.tenants, tenant_usage, cap),
        float(n),
        best_speed_per_class(profiles, mods),
        score_settings(now, cfg, w),
    )
    boost = rank_boost(q.inference, cfg)  # the day/night shift, a replica's rank (burst)
    scores = out[-1] if boost is None else out[-1] + boost
    return scores, dict(zip(TERMS, out[:-1], strict=True)), reg


def rank_boost(inference: np.ndarray, cfg: PolicyConfig) -> np.ndarray | None:
    """What is added to the compiled scores: the day/night period's shift
    (``daynight.kind_boost``) and a service replica's rank (``stages.burst.service_boost``);
    None when nothing is."""
    a, b = kind_boost(inference, cfg), service_boost(inference, cfg)
    if a is None or b is None:
        return b if a is None else a
    return a + b


def score_queue_rows(
    queue: PendingQueue,
    rows: np.ndarray,
    *,
    now: float,
    load: float,
    tenant_usage: Mapping[str, np.ndarray | float],
    capacity: Any,
    cfg: PolicyConfig,
    profiles: ProfileTable,
    n_tenants: int,
) -> np.ndarray:
    """``score_arrays(queue.rows(rows), ..., n_tenants=n_tenants)``'s scores, read from the
    queue's table in place (``fast.score_table_rows``, the same per-job arithmetic): a pass
    scores the one or two jobs queued since the last, and building their columns cost as
    much as scoring them. ``n_tenants``: the fair share's tenant count of the whole queue."""
    cap, mods = _capacity_and_models(capacity, None)
    _, w = regime_weights(load, cfg)
    table = queue.table()
    dom = _shares_by_index(
        set(table[rows, _TENANT_COLUMN].astype(np.int64).tolist()),
        queue.tenant_names(),
        tenant_usage,
        cap,
    )
    scores = K.score_table_rows(
        table,
        rows,
        dom,
        float(max(n_tenants, 1)),
        best_speed_per_class(profiles, mods),
        score_settings(now, cfg, w),
    )
    boost = rank_boost(table[rows, _INFERENCE_COLUMN], cfg)  # day/night, a replica's rank
    return scores if boost is None else scores + boost


def urgency(
    deadline: np.ndarray, now: float, remaining_s: np.ndarray, cfg: PolicyConfig
) -> np.ndarray:
    """0 without a deadline (NaN), rising to 1 as slack shrinks to 0; ``urgency_missed`` after
    (``fast.urgency_of`` per job, the term ``score_arrays`` uses)."""
    return K.urgency_many(
        np.asarray(deadline, dtype=float),
        float(now),
        np.asarray(remaining_s, dtype=float),
        float(cfg.urgency_scale_s),
        float(cfg.urgency_missed),
    )
