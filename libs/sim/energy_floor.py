"""The least energy any schedule can draw while its mean JCT stays within a ratio of the lower
bound: the energy-JCT frontier of a trace on a cluster, computed before any policy runs.

Why: issue 15 asks, at a trace's natural load, for a mean JCT <= 1.1x the lower bound and an
energy <= 0.8x fifo's, both at once. The two pull apart: a greener GPU is a slower one (seed
profiles: a CNN on a T4 draws 2.4x less energy per unit of work than on an A100 and runs 2.4x
slower). ``bounds.energy_kwh_lb_power_saving`` (every job on its greenest model) ignores the
JCT a schedule may spend; this floor charges it, so a report can say whether a pair of targets
can be met by any schedule at all, not just whether Mosaic met them.

The relaxation (a valid floor for any run that suspends idle nodes, standby draw 0): a job j
that runs a share x_jm of its work on GPU model m takes at least sum_m x_jm R_jm seconds
(R_jm: its runtime there; waits, boots, moves and failures only add) and draws at least
sum_m x_jm E_jm (E_jm = GPUs x R_jm x full power of its class there, idle included, as in
``energy_kwh_lb_power_saving``; sharing, interference and failed attempts only add). With
F_j its fastest runtime, mean JCT <= ratio x mean F_j asks sum_j sum_m x_jm (R_jm - F_j) <=
(ratio - 1) x sum_j F_j = B. Capacity, arrivals and contention are ignored (they only make the
least energy higher). For any price lambda >= 0 of a second of JCT, weak duality gives

    floor >= sum_j min_m (E_jm + lambda (R_jm - F_j)) - lambda B,

and the best lambda gives the linear relaxation's optimum (one coupling constraint). The
dual is concave and piecewise linear in lambda; its slope at lambda is sum_j D_j(lambda) - B
(D_j: the extra runtime of job j's choice at that price), which falls as lambda grows, so a
bisection on the slope finds the best price. Any lambda tried is a valid floor, so the
bisection's precision only makes the floor less tight, never wrong.

A model whose GPUs have less memory than the job asks per GPU is not open to it (it would die
of OOM there, ``libs.sim.engine``); a job no model can hold keeps every model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from libs.policy.cluster import EPS
from libs.sim.metrics import J_PER_KWH
from libs.sim.state import SimJob

# the mean-JCT ratios to the lower bound the frontier is reported at; 1.1 is issue 15's target
FRONTIER_RATIOS: tuple[float, ...] = (1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 2.0)
_BISECTIONS = 60  # halves the price interval each time: 2^-60 of its width


def job_tables(
    jobs: Sequence[SimJob],
    models: list[str],
    profiles,
    mem_gb_by_model: Mapping[str, float] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(runtime_s [job, model], energy_j [job, model], fastest_s [job]): each job's runtime
    and least draw on each model (inf where it cannot run: too little memory per GPU)."""
    runtime = np.array([j.runtime_s for j in jobs], dtype=float).reshape(len(jobs), len(models))
    gpus = np.array([j.gpus for j in jobs], dtype=float)
    power = np.empty_like(runtime)
    for c in {j.spec.workload_class for j in jobs}:
        rows = np.array([j.spec.workload_class == c for j in jobs])
        power[rows] = [profiles.power_w(m, c) for m in models]
    energy = gpus[:, None] * runtime * power
    fastest = np.array([j.fastest_runtime_s for j in jobs], dtype=float)
    if mem_gb_by_model:
        mem = np.array([mem_gb_by_model.get(m, np.inf) for m in models])
        ask = np.array([j.spec.gpu_mem_gb for j in jobs], dtype=float)
        closed = ask[:, None] > mem[None, :] + EPS  # the engine's fit rule (SimCluster)
        closed[closed.all(axis=1)] = False  # no model holds it: keep them all (still a floor)
        runtime = np.where(closed, np.inf, runtime)
        energy = np.where(closed, np.inf, energy)
    return runtime, energy, fastest


def _dual(energy: np.ndarray, extra: np.ndarray, budget_s: float, price: float) -> tuple:
    """(dual value in J, slope: extra runtime of the choices - budget) at ``price`` J/s."""
    cost = energy + price * extra
    pick = np.argmin(cost, axis=1)
    rows = np.arange(len(pick))
    return float(cost[rows, pick].sum() - price * budget_s), float(
        extra[rows, pick].sum() - budget_s
    )


def floor_j(runtime: np.ndarray, energy: np.ndarray, fastest: np.ndarray, ratio: float) -> float:
    """The least energy (J) of any schedule whose mean JCT is <= ``ratio`` x mean(fastest)
    (module docstring); inf if no choice of models keeps the runtimes alone within it."""
    if len(fastest) == 0:
        return 0.0
    extra = runtime - fastest[:, None]
    budget = (ratio - 1.0) * float(fastest.sum())
    if float(np.min(extra, axis=1).sum()) > budget + 1e-6 * max(1.0, abs(budget)):
        return float("inf")
    # a closed model's energy is inf, so its extra may be 0 (no inf x 0 at price 0)
    extra = np.where(np.isinf(extra), 0.0, extra)
    value0, slope0 = _dual(energy, extra, budget, 0.0)
    if slope0 <= 0.0:  # every job on its greenest model already keeps the JCT
        return float(np.min(energy, axis=1).sum())
    best, lo, hi = value0, 0.0, 1.0
    while True:  # grow the price until the choices keep the JCT (the slope turns <= 0)
        value, slope = _dual(energy, extra, budget, hi)
        best = max(best, value)
        if slope <= 0.0 or hi >= 1e15:
            break
        lo, hi = hi, hi * 4.0
    for _ in range(_BISECTIONS):  # every price tried is a floor: keep the highest
        mid = 0.5 * (lo + hi)
        value, slope = _dual(energy, extra, budget, mid)
        best = max(best, value)
        if slope > 0.0:
            lo = mid
        else:
            hi = mid
    return best


def frontier_kwh(
    jobs: Sequence[SimJob],
    models: list[str],
    profiles,
    mem_gb_by_model: Mapping[str, float] | None = None,
    ratios: Sequence[float] = FRONTIER_RATIOS,
) -> dict[str, float | None]:
    """{f"{ratio:g}": least kWh at mean JCT <= ratio x the lower bound} for each ratio; None
    where no schedule keeps that mean JCT (a job's fastest model lacks the memory it asks;
    None rather than inf keeps results.json plain JSON)."""
    runtime, energy, fastest = job_tables(jobs, models, profiles, mem_gb_by_model)
    out: dict[str, float | None] = {}
    for r in ratios:
        floor = floor_j(runtime, energy, fastest, r)
        out[f"{r:g}"] = floor / J_PER_KWH if np.isfinite(floor) else None
    return out
