"""Gavel's allocations (Narayanan et al., OSDI'20, section 4): the matrix X[job, GPU type] of
the time share each job should get on each type, as pure functions of the jobs' throughputs.

``max_min_allocation`` is the heterogeneity-aware max-min fairness LP (Gavel's
``max_min_fairness_perf``; Gavel's LAS): maximise t subject to, for every job i,
``sum_m thr[i, m] * X[i, m] * s_i / iso_i >= t``, each job's time shares summing to at most 1,
each type's GPUs (``s_i`` per job) not over-subscribed. ``iso_i`` is the job's throughput under
the paper's X^equal: an equal time share of every type in proportion to its GPUs, which is the
capacity-weighted mean of its throughputs (the common time share cancels out of the maximum).
With ``aware=False`` every throughput counts as 1 (Gavel's heterogeneity-agnostic
``max_min_fairness``): the LP then sees only time. Solved with HiGHS (``scipy.optimize.linprog``).

Where it differs from Gavel's code: a max-min LP has many optima (only the minimum is fixed);
Gavel's solver returns one of them, here the tie is broken towards the largest total of the
normalised throughputs (a secondary term weighted ``TIE_WEIGHT`` / jobs, too small to lower
the minimum), so the answer is determined and no GPU time the minimum does not need is left
idle. Priority weights are all 1 (the traces compared carry none).

``fifo_allocation`` is Gavel's heterogeneity-aware FIFO: in arrival order, each job not yet
placed takes the fastest type that still has GPUs for it, and keeps it (X = 1 there).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

TIE_WEIGHT = 1e-3  # secondary objective, divided by the number of jobs


def max_min_allocation(
    thr: np.ndarray, gpus: np.ndarray, type_gpus: np.ndarray, feasible: np.ndarray, aware: bool
) -> tuple[np.ndarray, float]:
    """(X[jobs, types], the max-min value t). ``thr[i, m]``: job i's throughput on type m
    (any unit: rows are normalised); ``gpus[i]``: its GPUs (Gavel's scale factor);
    ``type_gpus[m]``: GPUs of type m; ``feasible[i, m]``: whether job i may run on type m."""
    n, k = thr.shape
    if n == 0:
        return np.zeros((0, k)), 0.0
    if not (np.all(np.isfinite(thr)) and np.all(thr >= 0)):
        raise ValueError("thr: throughputs must be finite and >= 0")
    if np.any(gpus <= 0) or np.any(type_gpus < 0):
        raise ValueError("gpus must be > 0 and type_gpus >= 0")
    ok = feasible & (thr > 0) & (gpus[:, None] <= type_gpus[None, :] + 1e-9)
    if aware:
        t = np.where(ok, thr, 0.0)
        t = t / np.maximum(t.max(axis=1, keepdims=True), 1e-300)
        share = type_gpus / max(float(type_gpus.sum()), 1e-300)
        iso = (t * share[None, :]).sum(axis=1)  # throughput under X^equal (up to a constant)
        coef = t * gpus[:, None] / np.maximum(iso, 1e-300)[:, None]
    else:
        coef = np.where(ok, gpus[:, None], 0.0)
    runnable = np.flatnonzero(ok.any(axis=1))
    nr = len(runnable)
    # variables: X flattened row-major (n*k), then t. Rows: for each runnable job
    # t - sum_m coef X <= 0; for each job sum_m X <= 1; for each type sum_i gpus_i X <= GPUs.
    xcol = np.arange(n * k).reshape(n, k)
    r_fair = np.repeat(np.arange(nr), k + 1)
    c_fair = np.concatenate([xcol[runnable], np.full((nr, 1), n * k)], axis=1).ravel()
    v_fair = np.concatenate([-coef[runnable], np.ones((nr, 1))], axis=1).ravel()
    r_time = nr + np.repeat(np.arange(n), k)
    r_type = nr + n + np.tile(np.arange(k), n)
    rows = np.concatenate([r_fair, r_time, r_type])
    cols = np.concatenate([c_fair, xcol.ravel(), xcol.ravel()])
    vals = np.concatenate([v_fair, np.ones(n * k), np.repeat(gpus, k)])
    r = nr + n + k
    a = coo_matrix((vals, (rows, cols)), shape=(r, n * k + 1)).tocsr()
    b = np.concatenate([np.zeros(nr), np.ones(n), type_gpus.astype(float)])
    c = np.concatenate([-(TIE_WEIGHT / n) * coef.ravel(), [-1.0]])
    upper = np.concatenate([ok.ravel().astype(float), [np.inf]])
    bounds = np.stack([np.zeros(n * k + 1), upper], axis=1)
    res = linprog(c, A_ub=a, b_ub=b, bounds=bounds, method="highs")
    if res.status != 0:
        raise RuntimeError(f"gavel LP not solved: {res.message}")
    x = np.clip(res.x[: n * k].reshape(n, k), 0.0, 1.0)
    return x, float(res.x[-1])


def fifo_allocation(
    order: Sequence[int],
    thr: np.ndarray,
    gpus: np.ndarray,
    type_gpus: np.ndarray,
    feasible: np.ndarray,
    kept: dict[int, int],
) -> dict[int, int]:
    """Row -> type for Gavel's FIFO: rows in ``kept`` keep their type; the others, in
    ``order`` (arrival), take the fastest feasible type with GPUs left; a row with none waits."""
    left = type_gpus.astype(float).copy()
    out: dict[int, int] = {}
    for i, m in kept.items():
        out[i] = m
        left[m] -= gpus[i]
    for i in order:
        if i in out:
            continue
        for m in np.argsort(-thr[i], kind="stable").tolist():
            if feasible[i, m] and left[m] >= gpus[i] - 1e-9:
                out[i] = m
                left[m] -= gpus[i]
                break
    return out
