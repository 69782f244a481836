"""The rank stage's compiled loops: the priority terms and score (``_score_terms``, the formula of
``stages.rank.priority_terms``), the tenants' dominant shares, and the order's top rows
(``stages.rank.order_of`` with ``top``)."""

from __future__ import annotations

import numpy as np

from libs.policy.fast.compile import compiled
from libs.policy.stages.rank import SCORE_SETTINGS

_S = {name: i for i, name in enumerate(SCORE_SETTINGS)}
_NOW, _AGING = _S["now"], _S["aging_per_h"]
_SCALE, _MISSED = _S["urgency_scale_s"], _S["urgency_missed"]
_W_FAIR, _W_ENERGY = _S["w_fair_share"], _S["w_energy"]
_W_DEADLINE, _W_PRIORITY = _S["w_deadline"], _S["w_priority"]
_W_SHORT, _SHORT_SCALE = _S["w_short"], _S["short_scale_s"]
_W_URGENT = _S["w_urgent"]


@compiled
def rows_ranked_after(rows, s, e, q, s0, e0, q0, after):
    """The rows of ``rows`` ranked after the key (s0, e0, q0) (``after=False``: the others),
    in the order given. Ranked after: a lower score, or the same score and a later enqueue
    time, or both the same and a higher tie number (``priority.order_of``'s order)."""
    out = np.empty(len(rows), dtype=np.int64)
    n = 0
    for r in rows:
        si, ei = s[r], e[r]
        later = si < s0 or (si == s0 and (ei > e0 or (ei == e0 and q[r] > q0)))
        if later == after:
            out[n] = r
            n += 1
    return out[:n]


@compiled
def _clip01(x):
    """``np.clip(x, 0.0, 1.0)`` of one number (NaN stays NaN)."""
    return 0.0 if x < 0.0 else (1.0 if x > 1.0 else x)


@compiled
def urgency_of(deadline, now, remaining, scale, missed):
    """The deadline urgency of one job (``priority.urgency``): 0 without a deadline (NaN),
    ``missed`` once the slack is negative, else exp(-slack / scale)."""
    if np.isnan(deadline):
        return 0.0
    slack = deadline - now - remaining
    if slack < 0.0:
        return missed
    return np.exp(-slack / scale)


@compiled
def urgency_many(deadline, now, remaining, scale, missed):
    """``urgency_of`` per row."""
    out = np.empty(len(deadline))
    for i in range(len(deadline)):
        out[i] = urgency_of(deadline[i], now, remaining[i], scale, missed)
    return out


@compiled
def _score_terms(
    prio,
    es,
    enq,
    est,
    prog,
    deadline,
    dom,
    n_tenants,
    best,
    settings,
):
    """(base, fair share, energy, urgency, aging, short, score) of one queued job: the
    operations, and their order, of the numpy expressions the module docstring of
    ``priority`` writes down.
    ``dom``: its tenant's dominant share; ``best``: the fastest speed for its workload class;
    ``settings``: now, aging per hour, urgency scale, urgency once missed, and the regime's
    weights on fair share, energy, deadline and priority, the shortness weight and scale
    (``stages.rank.score_settings``).
    The one definition both ``priority_terms`` and ``score_table_rows`` use."""
    now, aging_per_h = settings[_NOW], settings[_AGING]
    scale, missed = settings[_SCALE], settings[_MISSED]
    w_fair, w_energy = settings[_W_FAIR], settings[_W_ENERGY]
    w_deadline, w_priority = settings[_W_DEADLINE], settings[_W_PRIORITY]
    base = (prio + 1.0) / 10.0
    fair = 1.0 / (1.0 + dom * n_tenants)
    energy = 1.0 - _clip01(es)
    remaining = est * _clip01(1.0 - prog) / best
    urg = urgency_of(deadline, now, remaining, scale, missed)
    waited = now - enq
    aging = aging_per_h * (0.0 if waited < 0.0 else waited) / 3600.0
    short = settings[_SHORT_SCALE] / (settings[_SHORT_SCALE] + remaining)
    mix = w_fair * fair + w_energy * energy + w_deadline * urg + w_priority
    live = urg if deadline - now - remaining >= 0.0 else 0.0  # False for NaN, as numpy
    score = base * mix + aging + settings[_W_SHORT] * short + settings[_W_URGENT] * live
    return base, fair, energy, urg, aging, short, score


@compiled
def priority_terms(
    prio,
    es,
    enq,
    est,
    prog,
    deadline,
    cls,
    tenant,
    tenant_dom,
    n_tenants,
    best,
    settings,
):
    """float[7, rows]: the terms of ``priority.score_arrays`` per queued row (base, fair share,
    energy, urgency, aging, short) and the score, base x (w_fair fair + w_energy energy +
    w_deadline urgency + w_priority) + aging + w_short short (``_score_terms``).
    ``tenant_dom``: dominant share per tenant index; ``best``: the fastest speed per
    workload class. A pass scores the one or two jobs queued since the last, where numpy's
    fixed cost per call was most of the time."""
    n = len(prio)
    out = np.empty((7, n))
    for i in range(n):
        t = _score_terms(
            prio[i],
            es[i],
            enq[i],
            est[i],
            prog[i],
            deadline[i],
            tenant_dom[tenant[i]],
            n_tenants,
            best[cls[i]],
            settings,
        )
        for k in range(7):
            out[k, i] = t[k]
    return out


@compiled
def score_table_rows(
    table,
    rows,
    tenant_dom,
    n_tenants,
    best,
    settings,
):
    """float[len(rows)]: the score (``_score_terms``) of rows of a queue's table, float[row,
    column] in ``queue.COLUMNS`` order (prio, es, enq, est, prog, deadline, gpus, cls,
    tenant): the one or two rows queued since the last pass, read in place instead of
    through a ``QueueArrays`` of them."""
    out = np.empty(len(rows))
    for i in range(len(rows)):
        r = rows[i]
        t = _score_terms(
            table[r, 0],
            table[r, 1],
            table[r, 2],
            table[r, 3],
            table[r, 4],
            table[r, 5],
            tenant_dom[np.int64(table[r, 8])],
            n_tenants,
            best[np.int64(table[r, 7])],
            settings,
        )
        out[i] = t[6]
    return out


@compiled
def dominant_shares(usage, capacity):
    """float[T]: per row of ``usage`` (float[T, R]), the largest share of any resource with
    capacity (``usage / capacity`` over the resources with capacity > 0, maximum; 0 when no
    resource has capacity): DRF's dominant share (``priority.dominant_share``)."""
    out = np.zeros(usage.shape[0])
    for t in range(usage.shape[0]):
        first = True
        m = 0.0
        for r in range(usage.shape[1]):
            if capacity[r] > 0.0:
                v = usage[t, r] / capacity[r]
                if first or v > m or np.isnan(v):
                    m = v
                    first = False
                if np.isnan(m):
                    break
        out[t] = m
    return out


@compiled
def _ranks_before(s, e, q, a, b):
    """Row ``a`` comes before row ``b`` in rank order: higher score, then earlier enqueue, then
    lower tie number (``priority.order_of``)."""
    if s[a] != s[b]:
        return s[a] > s[b]
    if e[a] != e[b]:
        return e[a] < e[b]
    return q[a] < q[b]


@compiled
def _sort_rows(rows, s, e, q):
    """``rows`` in rank order, a stable merge sort (equal keys keep the order given, as
    ``np.lexsort`` keeps it)."""
    n = len(rows)
    a = rows.copy()
    b = np.empty_like(a)
    width = 1
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i, j, k = lo, mid, lo
            while i < mid and j < hi:
                if _ranks_before(s, e, q, a[j], a[i]):
                    b[k] = a[j]
                    j += 1
                else:
                    b[k] = a[i]
                    i += 1
                k += 1
            while i < mid:
                b[k] = a[i]
                i += 1
                k += 1
            while j < hi:
                b[k] = a[j]
                j += 1
                k += 1
        a, b = b, a
        width *= 2
    return a


@compiled
def top_rows(rows, s, e, q, k):
    """(best, rest, ok): ``best`` = the rows of ``rows`` scoring at least the ``k``-th best
    score (every row when k >= len(rows)), in rank order; ``rest`` = the others, in the order
    given. The same rows and order as ``priority.order_of(s[rows], e[rows], k, q[rows])``
    (which keeps every tie of its last score). ``ok`` False (and nothing computed) when a key
    is NaN: the caller then asks numpy, whose sorts put NaN last."""
    n = len(rows)
    for r in rows:
        if np.isnan(s[r]) or np.isnan(e[r]) or np.isnan(q[r]):
            return rows[:0], rows[:0], False
    if k <= 0:
        return rows[:0], rows.copy(), True
    if k >= n:
        return _sort_rows(rows, s, e, q), rows[:0], True
    neg = np.empty(n)
    for i in range(n):
        neg[i] = -s[rows[i]]
    thr = -np.partition(neg, k - 1)[k - 1]
    best = np.empty(n, dtype=np.int64)
    rest = np.empty(n, dtype=np.int64)
    nb = 0
    nr = 0
    for r in rows:
        if s[r] >= thr:
            best[nb] = r
            nb += 1
        else:
            rest[nr] = r
            nr += 1
    return _sort_rows(best[:nb], s, e, q), rest[:nr], True
