"""Reserve/backfill, the definition of the reservation's node selection (``backfill.reserve``
runs it as one compiled loop, ``fast.reserve.reserve_candidates``, checked against this by
``tests/policy/test_kernels.py``). The rest of the stage, the earliest start on a node and
whether a backfilled job would delay a reservation, is ``libs.policy.backfill``.
"""

from __future__ import annotations

import numpy as np


def reserve_candidates(static, available, exclude, fit, first_end, now: float):
    """(node that fits now or -1, lower bounds, nodes): the first eligible node (``static`` and
    ``available`` and not ``exclude``) where the job fits now (``fit``); else the eligible
    nodes by their earliest possible start (the first end of a running job there, at least
    ``now``; ties to the lowest index), those that ever free up only."""
    eligible = np.flatnonzero(static & available & ~exclude)
    now_ok = np.flatnonzero(fit[eligible])
    if len(now_ok):
        return int(eligible[now_ok[0]]), np.zeros(0), np.zeros(0, dtype=np.int64)
    lbs = np.maximum(first_end[eligible], now)
    by = np.lexsort((eligible, lbs))
    keep = [k for k in by.tolist() if lbs[k] < np.inf]
    return -1, lbs[keep], eligible[keep]
