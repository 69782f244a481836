"""Power, the definitions of the two steps ``power.plan`` runs through compiled loops
(``fast.power``, checked against these by ``tests/policy/test_kernels.py``): which awake empty
nodes are due to suspend (``power_due``) and which suspended nodes to resume for the blocked
jobs (``power_resume``). The rules of the whole plan (warm reserve, reserved nodes, longest
idle first) are written in ``libs.policy.power``.
"""

from __future__ import annotations

import numpy as np

# a node is due this close to its time: ``idle_since + suspend_after`` is the instant the step
# is asked for, and ``now - idle_since`` there can round to just under ``suspend_after`` (the
# node then stayed up until some unrelated event)
DUE_EPS_S = 1e-6


def power_due(now: float, idle_since, suspended, resuming, empty, suspend_after: float):
    """(due, any asleep, any due, next due time or inf): a node is due to sleep when it is
    awake (neither suspended nor resuming), empty (``power.empty_nodes``) and idle at least
    ``suspend_after`` (``now - idle_since``; NaN while it holds a job); the next due time is
    the earliest ``idle_since + suspend_after`` after ``now`` among awake idle nodes."""
    awake = ~suspended & ~resuming
    with np.errstate(invalid="ignore"):
        due = awake & (now - idle_since >= suspend_after - DUE_EPS_S) & empty
    idle = awake & ~np.isnan(idle_since)
    times = idle_since[idle] + suspend_after
    later = times[times > now + DUE_EPS_S]
    nxt = float(later.min()) if len(later) else np.inf
    return due, bool(suspended.any()), bool(due.any()), nxt


def power_resume(static, counts, needs, claim, down, rank, gpu_total, eps: float):
    """(nodes to resume, bool[N] needed by some blocked job), updating ``claim`` and ``down``
    in place. Per group g of blocked jobs in rank order (``static[g]``: the nodes that could
    hold its shape; ``counts[g]`` jobs, each needing ``needs[g]`` GPUs): each job first takes
    the unclaimed GPUs of a node already resuming (``claim``), else wakes the first suspended
    node (``down``) that could hold it in ``rank`` order; nothing is woken while no node is
    down or resuming."""
    resume: list[int] = []
    needed = np.zeros(static.shape[1], dtype=bool)
    waking = bool(down.any() or (claim > 0).any())
    for g in range(len(static)):
        needed |= static[g]
        if not waking:
            continue
        for _ in range(counts[g]):
            up = np.flatnonzero(static[g] & (claim >= needs[g] - eps))
            if len(up):
                claim[up[0]] -= needs[g]
                continue
            dn = np.flatnonzero((static[g] & down)[rank])
            if len(dn) == 0:
                break
            k = int(rank[dn[0]])
            down[k] = False
            claim[k] = float(gpu_total[k]) - needs[g]
            resume.append(k)
        waking = bool(down.any() or (claim > 0).any())
    return resume, needed
