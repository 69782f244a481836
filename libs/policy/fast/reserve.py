"""The reservation's compiled node selection (``stages.reserve.reserve_candidates`` is its
definition): the first node that fits now, else the candidates by earliest possible start."""

from __future__ import annotations

import numpy as np

from libs.policy.fast.compile import compiled


@compiled
def reserve_candidates(static, available, exclude, fit, first_end, now):
    """The reservation search's nodes (``backfill.reserve``): (the lowest eligible node that
    fits now, or -1; else the eligible nodes with a finite lower bound on their start, as
    (bound, node) sorted by bound then node). Eligible: ``static & available & ~exclude``;
    a node's bound is ``max(first_end[node], now)`` (it needs at least its first release).
    One pass instead of a dozen numpy calls on ~100 nodes, which was most of a reservation."""
    n = len(static)
    lbs = np.empty(n)
    nodes = np.empty(n, dtype=np.int64)
    k = 0
    for i in range(n):
        if not static[i] or not available[i] or exclude[i]:
            continue
        if fit[i]:
            return i, lbs[:0], nodes[:0]
        lb = first_end[i]
        if lb < now:
            lb = now
        if lb < np.inf:
            lbs[k] = lb
            nodes[k] = i
            k += 1
    by = np.argsort(lbs[:k], kind="mergesort")  # stable: equal bounds keep node order
    return -1, lbs[:k][by], nodes[:k][by]
