"""Metrics of one simulated run. Each is defined in ``docs/metrics.md``; the names here carry
their units. Inputs are the engine's ``SimResult``; nothing is re-simulated.
"""

from __future__ import annotations

import math

import numpy as np

from libs.sim.state import COMPLETED, FAILED, SimResult
from proto.jobs import HIGH_PRIORITY

DEFAULT_TARIFF_USD_PER_KWH = 0.12
J_PER_KWH = 3.6e6


def _pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if a.size else float("nan")


def _mean(a: np.ndarray) -> float:
    return float(a.mean()) if a.size else float("nan")


def jain(x: np.ndarray) -> float:
    """Jain's fairness index: 1 = all equal, 1/n = one takes everything."""
    if x.size == 0 or not np.any(x):
        return float("nan")
    return float(x.sum() ** 2 / (x.size * (x**2).sum()))


def compute(r: SimResult, tariff_usd_per_kwh: float = DEFAULT_TARIFF_USD_PER_KWH) -> dict:
    jobs = r.jobs
    done = [j for j in jobs if j.state == COMPLETED]
    submit = np.array([j.submit_s for j in done])
    end = np.array([j.end_s for j in done])
    jct = end - submit
    wait = np.array([j.wait_s for j in done])
    prio = np.array([j.priority for j in done])
    fastest = np.array([j.fastest_runtime_s for j in done])
    gpus = np.array([j.gpus for j in done])
    window_s = max(r.t_end_s - r.t0_s, 1e-9)
    cap_s = r.capacity_gpus * window_s
    attempts = sum(j.attempts for j in jobs)
    failed_attempts = sum(j.failed_attempts for j in jobs)
    failed_jobs = [j for j in jobs if j.state == FAILED]
    idle_j = r.idle_power_w * window_s - r.idle_saved_j  # suspended nodes draw standby power
    energy_j = idle_j + sum(j.energy_active_j for j in jobs)
    energy_kwh = energy_j / J_PER_KWH
    high = prio >= HIGH_PRIORITY
    low_class = int(prio.min()) if prio.size else 0
    low = prio == low_class
    # deadline attainment over every job that had one (failed ones missed it)
    with_deadline = [j for j in jobs if j.spec.deadline is not None]
    met = sum(1 for j in with_deadline if j.state == COMPLETED and j.end_s <= j.spec.deadline)
    slowdown = jct / np.maximum(fastest, 1e-9)
    tenants = sorted({j.spec.tenant for j in done})
    per_tenant = np.array(
        [slowdown[[j.spec.tenant == t for j in done]].mean() for t in tenants] if done else []
    )
    frag = r.samples_frag[~np.isnan(r.samples_frag)] if r.samples_frag.size else np.zeros(0)
    util_overall = r.alloc_gpu_s / cap_s
    busy = r.busy_alloc_gpu_s / (r.capacity_gpus * r.busy_s) if r.busy_s > 0 else float("nan")
    return {
        # completed work in GPU-hours on the reference GPU (trace.REFERENCE_MODEL: the runtime
        # est_runtime_s states, less any noise the policy was told), the same for a job wherever
        # it ran: energy per unit of work
        "work_ref_gpu_hours": float(
            sum(j.gpus * j.spec.est_runtime_s / j.est_factor for j in done) / 3600.0
        ),
        "utilization": busy,
        "utilization_busy_window_s": r.busy_s,
        "work_utilization": float((gpus * fastest).sum() / cap_s),
        "allocation_ratio": util_overall,
        "jct_mean_s": _mean(jct),
        "jct_p50_s": _pct(jct, 50),
        "jct_p99_s": _pct(jct, 99),
        "queue_delay_mean_s": _mean(wait),
        "queue_delay_high_mean_s": _mean(wait[high]),
        "queue_delay_high_p99_s": _pct(wait[high], 99),
        "queue_delay_other_mean_s": _mean(wait[~high]),
        "queue_delay_other_p99_s": _pct(wait[~high], 99),
        "deadline_attainment": met / len(with_deadline) if with_deadline else float("nan"),
        "deadline_jobs": len(with_deadline),
        "energy_kwh": energy_kwh,
        "energy_idle_kwh": idle_j / J_PER_KWH,
        "energy_active_kwh": (energy_j - idle_j) / J_PER_KWH,
        "idle_power_kw": r.idle_power_w / 1000.0,
        "end_idle_power_kw": (r.idle_power_w if r.end_idle_power_w is None else r.end_idle_power_w)
        / 1000.0,
        "idle_saved_kwh": r.idle_saved_j / J_PER_KWH,
        "node_suspend_hours": r.node_suspend_s / 3600.0,
        "energy_cost_usd": energy_kwh * tariff_usd_per_kwh,
        "tariff_usd_per_kwh": tariff_usd_per_kwh,
        "failure_rate": failed_attempts / attempts if attempts else 0.0,
        "failed_attempts": failed_attempts,
        "attempts": attempts,
        "jobs_failed_rate": len(failed_jobs) / len(jobs) if jobs else 0.0,
        "jobs_failed": len(failed_jobs),
        "jobs_completed": len(done),
        "starvation_class": low_class,
        "starvation_p99_wait_s": _pct(wait[low], 99),
        "starvation_max_wait_s": float(wait[low].max()) if low.any() else float("nan"),
        "ftf_slowdown_mean": _mean(slowdown),
        "ftf_slowdown_p99": _pct(slowdown, 99),
        "ftf_tenant_jain": jain(per_tenant),
        "fragmentation": _mean(frag),
        "makespan_s": window_s if jobs else 0.0,
        "wall_s": r.wall_s,
        "jobs_per_s": len(jobs) / r.wall_s if r.wall_s > 0 else math.inf,
        "events": r.events,
        "passes": r.passes,
        **move_metrics(r),
    }


def move_metrics(r: SimResult) -> dict:
    """Moves (libs.sim.moves): checkpoint-and-requeue counts, and the delay from each requeue
    to the next start (the resume bound is 30 min by default: the max says whether it held)."""
    delays = np.array([d for j in r.jobs for d in j.resume_delays_s])
    moves = sum(j.moves for j in r.jobs)
    migrations = sum(j.migrations for j in r.jobs)
    return {
        "preemptions": moves - migrations,
        "migrations": migrations,
        "moved_jobs": sum(1 for j in r.jobs if j.moves),
        "shrinks": sum(j.shrinks for j in r.jobs),  # of the preemptions: elastic jobs shrunk
        "grows": sum(j.grows for j in r.jobs),  # of the preemptions: shrunk jobs grown back
        "resume_delay_p50_s": _pct(delays, 50),
        "resume_delay_p99_s": _pct(delays, 99),
        "resume_delay_max_s": float(delays.max()) if delays.size else float("nan"),
        "preempted_non_checkpointable": r.preempted_non_checkpointable,
    }


ENERGY_WINDOW_RULE = (
    "from the first arrival for makespan_lb_s (libs.sim.bounds: max(last submit + fastest "
    "runtime of any job, all work on all GPUs) - first arrival), or to the policy's own last "
    "event if later; a run that ends before the window's end is charged its end idle draw "
    "for the rest"
)


def energy_window_s(bounds: dict) -> float:
    """The energy window's length, from the trace and the cluster alone: ``makespan_lb_s``.

    Why this one: no schedule ends before it, so every run that completes its jobs is charged
    exactly what it drew over its own makespan, nothing extrapolated, and the figure cannot
    move when another policy joins or leaves the comparison (the old window, the longest
    makespan of the run, did: Mosaic/fifo energy 0.789x with some policies, 0.834x with
    others). A longer fixed window (e.g. last arrival + the longest job) would add the same
    idle energy to every policy, diluting the ratios by an amount set by the window, not by
    the decisions. A run that ends earlier (jobs failed) is charged its end idle draw up to
    the window's end, so dropping work never looks like saving energy.
    """
    return float(bounds.get("makespan_lb_s", 0.0))


def rewindow(m: dict, window_s: float) -> dict:
    """Energy over ``max(window_s, own makespan)`` (``energy_window_s``: the window comes
    from the trace and cluster alone), and energy per unit of completed work.

    The own-window figure stays in ``energy_own_window_kwh``. The time between a run's own
    end and the window's end (only for a run that ends first) is charged at the idle draw the
    cluster had at that end (``end_idle_power_kw``: all GPUs idle, except nodes a power-saving
    policy had suspended then, which stay suspended). ``energy_kwh_per_ref_gpu_hour``: kWh
    per GPU-hour of completed work measured on the reference GPU (``work_ref_gpu_hours``).
    """
    out = dict(m)
    out["energy_own_window_kwh"] = m["energy_kwh"]
    own = m.get("energy_idle_kwh", m["idle_power_kw"] * m["makespan_s"] / 3600.0)
    tail_kw = m.get("end_idle_power_kw", m["idle_power_kw"])
    idle = own + tail_kw * max(0.0, window_s - m["makespan_s"]) / 3600.0
    out["energy_idle_kwh"] = idle
    out["energy_kwh"] = m["energy_active_kwh"] + idle
    out["energy_cost_usd"] = out["energy_kwh"] * m["tariff_usd_per_kwh"]
    out["energy_window_s"] = window_s
    out["energy_charged_s"] = max(window_s, m["makespan_s"])
    work = m.get("work_ref_gpu_hours", 0.0)
    out["energy_kwh_per_ref_gpu_hour"] = out["energy_kwh"] / work if work > 0 else float("nan")
    return out
