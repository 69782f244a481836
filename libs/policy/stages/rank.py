"""Rank: the priority of each queued job and the order of the queue (the definitions).

score = p × (w_fair·fair_share + w_energy·(1 − energy_sensitivity) + w_deadline·urgency
             + w_priority·1) + aging + w_short·short + w_urgent·live_urgency + boost

* ``boost``: the day/night period's score for the job's kind (``libs.policy.daynight.
  kind_boost``; 0 with the calendar off), added after the compiled loop.

* ``p`` = (priority + 1) / 10, the submitted priority in (0, 1].
* The weights depend on the load regime (``regime``): below ``cfg.low_load`` fairness leads,
  above ``cfg.high_load`` the submitted priority leads among jobs of similar length (protect
  critical jobs when it is tight). Each regime's weights sum to 1, so a fresh job's score
  before ``short`` is at most 1.
* ``fair_share`` = 1 / (1 + dominant_share × tenants): 1 for a tenant using nothing, 1/2 for a
  tenant at exactly its equal share (DRF, Ghodsi et al. NSDI'11: the dominant share is the
  largest share of any one resource the tenant holds).
* ``urgency`` = exp(−slack / urgency_scale_s), slack = deadline − now − remaining runtime on the
  fastest GPU model present; ``cfg.urgency_missed`` once the deadline can no longer be met;
  0 without a deadline.
* ``short`` = short_scale_s / (short_scale_s + remaining runtime on the fastest GPU model
  present), in (0, 1]: shortest remaining time first (issue 15). Added beside aging, not
  multiplied by ``p``: with ``cfg.w_short`` (10) above any fresh job's other terms (at most 1)
  a job's expected length leads its place, and priority, fair share and urgency order jobs of
  similar length. Why: mean JCT on a loaded cluster is set by short jobs waiting behind long
  ones (first 20k Philly jobs, 0.8 effective load: jobs under 1 h, 88 % of them, waited 4.4 h
  for 0.35 h of run with a runtime-blind order). It does not change while a job waits (only a move's
  progress does), so a rank epoch keeps it exactly.
* ``live_urgency`` = ``urgency`` while the deadline can still be met (slack >= 0), else 0:
  ``cfg.w_urgent`` lets a deadline lead a job's place beside its length, as ``short`` does,
  where inside ``p × (...)`` it is worth at most ``p × w_deadline`` (<= 0.3) against the
  ``w_short`` (10) of length. A deadline already lost gets nothing from it: raising a job that
  will miss anyway only delays one that can still make it. Issue 15, full Philly (seed cluster,
  0.8 effective load, power saving on every policy), 0 -> 0.5: deadlines met 84.1 / 84.4 /
  85.7 -> 92.0 / 92.2 / 91.8 % on seeds 0 / 1 / 2, mean JCT +5.4 / +1.3 / +0.2 %; Helios 50k
  94.4 -> 95.4 %, +1.4 %; natural load unchanged (docs/benchmarks.md, with 0.1 to 5).
* ``aging`` = aging_per_h × hours waited, unbounded: a job that waited longer than
  (1 + w_short) / aging_per_h hours outranks every fresh job (starvation freedom; 440 h with
  the defaults, the price of shortest-first: a long job may wait behind a stream of short
  ones that long).
* The order: higher score first, then earlier enqueue, then the lower tie number.

``priority_terms`` and ``order_of`` are these rules in numpy. The pass computes the terms in one
compiled loop (``fast.rank``: ``priority_terms``, ``score_table_rows``, ``top_rows``), checked
bit for bit against them (``tests/policy/test_kernels.py``); ``libs.policy.priority`` is the
rank stage as callers use it.
"""

from __future__ import annotations

import math

import numpy as np

from libs.policy.config import PolicyConfig, RegimeWeights

TERMS: tuple[str, ...] = ("base", "fair_share", "energy", "urgency", "aging", "short")
# the settings vector of the score (``score_settings``), in the order the compiled loop reads it
SCORE_SETTINGS: tuple[str, ...] = (
    "now",
    "aging_per_h",
    "urgency_scale_s",
    "urgency_missed",
    "w_fair_share",
    "w_energy",
    "w_deadline",
    "w_priority",
    "w_short",
    "short_scale_s",
    "w_urgent",
)


def regime(load: float, cfg: PolicyConfig) -> str:
    """ "low" below cfg.low_load, "high" above cfg.high_load, else "balanced"."""
    if load < cfg.low_load:
        return "low"
    if load > cfg.high_load:
        return "high"
    return "balanced"


def regime_weights(load: float, cfg: PolicyConfig) -> tuple[str, RegimeWeights]:
    r = regime(load, cfg)
    return r, cfg.weights(r)


def score_settings(now: float, cfg: PolicyConfig, w: RegimeWeights) -> np.ndarray:
    """float[len(SCORE_SETTINGS)]: the score's settings, in ``SCORE_SETTINGS`` order."""
    return np.array(
        [
            now,
            cfg.aging_per_h,
            cfg.urgency_scale_s,
            cfg.urgency_missed,
            w.fair_share,
            w.energy,
            w.deadline,
            w.priority,
            cfg.w_short,
            cfg.short_scale_s,
            cfg.w_urgent,
        ],
        dtype=float,
    )


# the C library's exp, which the compiled loop calls: numpy's own SIMD exp (on AVX-512 CPUs)
# may round the last bit differently
_libm_exp = np.vectorize(math.exp, otypes=[float])


def urgency(
    deadline: np.ndarray, now: float, remaining_s: np.ndarray, scale_s: float, missed: float
) -> np.ndarray:
    """0 without a deadline (NaN), exp(-slack / scale_s) while the slack is >= 0, ``missed``
    after; slack = deadline - now - remaining_s."""
    deadline = np.asarray(deadline, dtype=float)
    slack = deadline - now - np.asarray(remaining_s, dtype=float)
    if not len(slack):
        return np.zeros(0)
    with np.errstate(invalid="ignore", over="ignore"):
        u = _libm_exp(-np.maximum(slack, 0.0) / scale_s)
    u = np.where(slack < 0, missed, u)
    return np.where(np.isnan(deadline), 0.0, u)


def priority_terms(
    prio, es, enq, est, prog, deadline, dom, n_tenants: float, best, settings: np.ndarray
) -> np.ndarray:
    """float[7, rows]: base, fair share, energy, urgency, aging, short and the score of each
    queued job (the module's formula). Per row: ``dom`` its tenant's dominant share, ``best`` the
    fastest speed for its workload class; ``n_tenants`` the tenants the fair share counts;
    ``settings`` as ``score_settings``."""
    s = dict(zip(SCORE_SETTINGS, settings.tolist(), strict=True))
    now = s["now"]
    fair = 1.0 / (1.0 + dom * n_tenants)
    remaining = est * np.clip(1.0 - prog, 0.0, 1.0) / best
    urg = urgency(deadline, now, remaining, s["urgency_scale_s"], s["urgency_missed"])
    base = (prio + 1.0) / 10.0
    energy = 1.0 - np.clip(es, 0.0, 1.0)
    aging = s["aging_per_h"] * np.maximum(now - enq, 0.0) / 3600.0
    short = s["short_scale_s"] / (s["short_scale_s"] + remaining)
    mix = (
        s["w_fair_share"] * fair + s["w_energy"] * energy + s["w_deadline"] * urg + s["w_priority"]
    )
    live = np.where(np.asarray(deadline, dtype=float) - now - remaining >= 0.0, urg, 0.0)
    score = base * mix + aging + s["w_short"] * short + s["w_urgent"] * live
    return np.array([base, fair, energy, urg, aging, short, score]).reshape(7, len(prio))


def order_of(
    scores: np.ndarray, enq: np.ndarray, top: int | None = None, tie: np.ndarray | None = None
) -> np.ndarray:
    """Best first: higher score, then earlier enqueue, then lower ``tie`` (default: the row
    index; a ``PendingQueue`` passes its insertion sequence), so the order is deterministic.

    ``top``: only the first ``top`` or a few more positions are needed; the result is then a
    prefix of the full order (every job scoring at least the ``top``-th best score, ties
    included, so the prefix is exactly the full order's), found in O(n) + O(top log top)."""
    n = len(scores)
    tie = np.arange(n) if tie is None else tie
    if top is None or top >= n:
        return np.lexsort((tie, enq, -scores))
    thr = -np.partition(-scores, top - 1)[top - 1]
    rows = np.flatnonzero(scores >= thr)
    return rows[np.lexsort((tie[rows], enq[rows], -scores[rows]))]
