"""Lower (and upper) bounds computed from the trace and the cluster alone, before any policy runs.

No schedule can beat them, so a policy that does is a bug in the policy or the simulator
(``check`` lists every violation; the tests run it for every policy).

- ``jct_mean_lb_s``: every job takes at least its fastest-GPU runtime, so the mean JCT of any
  set of completed jobs is at least the mean of their fastest runtimes (``check`` compares job
  by job, which also covers the mean).
- ``makespan_lb_s``: the last job cannot end before max(submit + fastest runtime), nor before
  all work (GPUs x fastest runtime) fits into the capacity after the first arrival.
- ``work_utilization_ub``: min(1, demand / (capacity x makespan_lb)), demand being the sum of
  GPUs x fastest runtime; the window a policy measures over is never shorter than makespan_lb.
- ``energy_kwh_lb``: every GPU draws idle power over at least makespan_lb, and each job adds at
  least min over GPU models of GPUs x runtime x (active - idle) power.
- ``energy_kwh_lb_power_saving``: the floor for a run that suspends idle nodes (their GPUs draw
  nothing, engine.STANDBY_W_PER_GPU = 0): each job draws at least min over GPU models of GPUs x
  runtime x full active power (idle included); checked instead of ``energy_kwh_lb`` for runs
  that suspended nodes.
- ``energy_kwh_lb_power_saving_at_jct``: {ratio: kWh}, the same floor for a run whose mean JCT
  is at most ratio x ``jct_mean_lb_s``: the energy-JCT frontier (``libs.sim.energy_floor``),
  so a report can say whether an energy target and a JCT target can be met together at all
  (None: no schedule reaches that mean JCT).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from libs.sim.energy_floor import frontier_kwh
from libs.sim.metrics import J_PER_KWH
from libs.sim.state import COMPLETED, SimJob, SimResult

TOL = 1e-6


def compute(
    jobs: Sequence[SimJob],
    models: list[str],
    capacity_gpus: float,
    idle_power_w: float,
    profiles,
    mem_gb_by_model: Mapping[str, float] | None = None,
) -> dict:
    """Bounds for ``jobs`` (runtime rows over ``models``) on a cluster of that capacity
    (``mem_gb_by_model``: GPU memory per model, which closes a model to a job that asks more)."""
    if not jobs:
        return {
            "jct_mean_lb_s": 0.0,
            "makespan_lb_s": 0.0,
            "work_utilization_ub": 0.0,
            "energy_kwh_lb": 0.0,
            "energy_kwh_lb_power_saving": 0.0,
            "energy_kwh_lb_power_saving_at_jct": {},
            "demand_gpu_s": 0.0,
            "demand_over_capacity": 0.0,
        }
    submit = np.array([j.submit_s for j in jobs])
    fastest = np.array([j.fastest_runtime_s for j in jobs])
    gpus = np.array([j.gpus for j in jobs])
    t0 = float(submit.min())
    demand = float((gpus * fastest).sum())
    makespan_lb = max(float((submit + fastest).max()) - t0, demand / capacity_gpus)
    extra = {}
    full = {}
    for c in {j.spec.workload_class for j in jobs}:
        extra[c] = np.array(
            [max(0.0, profiles.power_w(m, c) - profiles.idle_power_w(m)) for m in models]
        )
        full[c] = extra[c] + np.array([profiles.idle_power_w(m) for m in models])
    job_min_j = sum(
        float((j.gpus * j.runtime_s * extra[j.spec.workload_class]).min()) for j in jobs
    )
    job_full_min_j = sum(
        float((j.gpus * j.runtime_s * full[j.spec.workload_class]).min()) for j in jobs
    )
    span = float(submit.max()) - t0
    return {
        "jct_mean_lb_s": float(fastest.mean()),
        "makespan_lb_s": makespan_lb,
        "work_utilization_ub": min(1.0, demand / (capacity_gpus * makespan_lb)),
        "energy_kwh_lb": (idle_power_w * makespan_lb + job_min_j) / J_PER_KWH,
        "energy_kwh_lb_power_saving": job_full_min_j / J_PER_KWH,
        "energy_kwh_lb_power_saving_at_jct": frontier_kwh(jobs, models, profiles, mem_gb_by_model),
        "demand_gpu_s": demand,
        # offered load over the arrival span, on each job's fastest GPU
        "demand_over_capacity": demand / (capacity_gpus * span) if span > 0 else float("inf"),
    }


def check(result: SimResult, metrics: dict, bounds: dict) -> list[str]:
    """Every bound the run beats (empty = consistent)."""
    bad: list[str] = []
    for j in result.jobs:
        if j.state == COMPLETED and j.end_s - j.submit_s < j.fastest_runtime_s - TOL:
            bad.append(f"job {j.spec.id}: JCT below its fastest-GPU runtime")
            break
    done = [j for j in result.jobs if j.state == COMPLETED]
    if len(done) == len(result.jobs) and done:
        if metrics["jct_mean_s"] < bounds["jct_mean_lb_s"] - TOL:
            bad.append("mean JCT below the bound")
        if metrics["makespan_s"] < bounds["makespan_lb_s"] - TOL:
            bad.append("makespan below the bound")
        key = "energy_kwh_lb_power_saving" if result.idle_saved_j > 0 else "energy_kwh_lb"
        if metrics["energy_kwh"] < bounds[key] * (1 - 1e-9) - TOL:
            bad.append("energy below the bound")
        if result.idle_saved_j > 0:
            bad += _frontier_check(metrics, bounds)
    if metrics["work_utilization"] > bounds["work_utilization_ub"] + TOL:
        bad.append("work utilization above the bound")
    for k in ("utilization", "allocation_ratio"):
        v = metrics[k]
        if v == v and not -TOL <= v <= 1 + TOL:
            bad.append(f"{k} outside [0, 1]")
    return bad


def _frontier_check(metrics: dict, bounds: dict) -> list[str]:
    """A power-saving run whose mean JCT is within a ratio of the bound draws at least that
    ratio's floor (``energy_kwh_lb_power_saving_at_jct``)."""
    lb = bounds["jct_mean_lb_s"]
    bad = []
    for ratio, floor_kwh in bounds.get("energy_kwh_lb_power_saving_at_jct", {}).items():
        within = metrics["jct_mean_s"] <= float(ratio) * lb + TOL
        if floor_kwh is None and within:
            bad.append(f"mean JCT within {ratio}x the bound, which no schedule reaches")
        elif within and metrics["energy_kwh"] < floor_kwh * (1 - 1e-9) - TOL:
            bad.append(f"energy below the floor at mean JCT <= {ratio}x the bound")
    return bad
