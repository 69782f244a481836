"""The power stage's compiled loops (``stages.power`` holds their definitions): which empty nodes
are due to suspend, and which suspended nodes to resume for the blocked jobs."""

from __future__ import annotations

import numpy as np

from libs.policy.fast.compile import compiled
from libs.policy.stages.power import DUE_EPS_S


@compiled
def power_due(now, idle_since, suspended, resuming, empty, suspend_after):
    """(due, any asleep, any due, next due time or inf) of the power step: a node is due to
    sleep when it is awake (neither suspended nor resuming), empty (``power.empty_nodes``) and
    idle at least ``suspend_after`` (``now - idle_since``; NaN while it holds a job); the next
    due time is the earliest ``idle_since + suspend_after`` after ``now`` among awake idle
    nodes. The comparisons and sums of the numpy expressions, node by node."""
    n = len(idle_since)
    due = np.zeros(n, dtype=np.bool_)
    any_asleep = False
    any_due = False
    nxt = np.inf
    for i in range(n):
        if suspended[i]:
            any_asleep = True
            continue
        if resuming[i] or np.isnan(idle_since[i]):
            continue
        if now - idle_since[i] >= suspend_after - DUE_EPS_S and empty[i]:
            due[i] = True
            any_due = True
        t = idle_since[i] + suspend_after
        if t > now + DUE_EPS_S and t < nxt:
            nxt = t
    return due, any_asleep, any_due, nxt


@compiled
def power_resume(static, counts, needs, claim, down, rank, gpu_total, eps):
    """The resume half of ``power.plan``: for each group of blocked jobs in order (``static``:
    bool[group, node], where its shape fits; ``counts``: jobs; ``needs``: GPUs each asks),
    every job first takes unclaimed GPUs of a node already booting (the first such node, in
    index order: ``claim`` >= need), else wakes the first suspended node (``down``) it fits, in
    ``rank`` order, which it claims minus its need, while some node is left to wake or to
    claim. Returns (nodes to resume, in order; nodes some group fits). ``claim`` and ``down``
    are updated in place."""
    n = static.shape[1]
    resume = np.empty(n, dtype=np.int64)
    n_resume = 0
    needed = np.zeros(n, dtype=np.bool_)
    waking = False
    for i in range(n):
        if down[i] or claim[i] > 0:
            waking = True
            break
    for g in range(static.shape[0]):
        for i in range(n):
            if static[g, i]:
                needed[i] = True
        if not waking:
            continue
        need = needs[g]
        for _ in range(counts[g]):
            up = -1
            for i in range(n):
                if static[g, i] and claim[i] >= need - eps:
                    up = i
                    break
            if up >= 0:
                claim[up] -= need
                continue
            k = -1
            for p in range(n):
                if static[g, rank[p]] and down[rank[p]]:
                    k = rank[p]
                    break
            if k < 0:
                break
            down[k] = False
            claim[k] = float(gpu_total[k]) - need
            resume[n_resume] = k
            n_resume += 1
        waking = False
        for i in range(n):
            if down[i] or claim[i] > 0:
                waking = True
                break
    return resume[:n_resume], needed
