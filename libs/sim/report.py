"""Tables and plots of a comparison: the seed-style before/after table and the full one.

``render_table(results)`` returns rich renderables (print each with a ``Console``);
``write_plots(results, runs, out_dir)`` writes PNGs: JCT CDF, utilization and queue length over
time, and energy per policy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rich.table import Table

from libs.sim.state import COMPLETED, SimResult

# (key, label, formatter, lower is better?)
HEADLINE: tuple[tuple[str, str, str, bool], ...] = (
    ("utilization", "busy utilization", "pct", False),
    ("queue_delay_high_mean_s", "high-priority mean queueing delay", "dur", True),
    ("energy_cost_usd", "energy cost", "usd", True),
    ("failure_rate", "failure rate (failed attempts)", "pct", True),
)
FULL: tuple[tuple[str, str, str], ...] = (
    ("utilization", "busy util", "pct"),
    ("work_utilization", "work util", "pct"),
    ("allocation_ratio", "alloc ratio", "pct"),
    ("jct_mean_s", "JCT mean", "dur"),
    ("jct_p50_s", "JCT p50", "dur"),
    ("jct_p99_s", "JCT p99", "dur"),
    ("queue_delay_high_mean_s", "hi-pri wait", "dur"),
    ("queue_delay_high_p99_s", "hi-pri wait p99", "dur"),
    ("deadline_attainment", "deadlines met", "pct"),
    ("energy_kwh", "energy kWh", "num"),
    ("energy_cost_usd", "energy $", "usd"),
    ("energy_kwh_per_ref_gpu_hour", "kWh/V100-GPU-h", "num"),
    ("failure_rate", "failure rate", "pct"),
    ("jobs_failed", "jobs failed", "int"),
    ("starvation_p99_wait_s", "low-pri wait p99", "dur"),
    ("starvation_max_wait_s", "low-pri wait max", "dur"),
    ("ftf_slowdown_p99", "slowdown p99", "num"),
    ("fragmentation", "fragmentation", "pct"),
    ("makespan_s", "makespan", "dur"),
    ("wall_s", "wall s", "num"),
)


def fmt(value, kind: str) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if kind == "pct":
        return f"{100 * value:.1f}%"
    if kind == "usd":
        return f"${value:,.0f}" if value >= 100 else f"${value:,.2f}"
    if kind == "int":
        return f"{int(value):,}"
    if kind == "dur":
        v = float(value)
        if v >= 3600:
            return f"{v / 3600:.2f} h"
        if v >= 60:
            return f"{v / 60:.1f} min"
        return f"{v:.0f} s"
    return f"{value:,.2f}" if abs(value) < 1000 else f"{value:,.0f}"


def change(before, after, lower_better: bool) -> str:
    if before is None or after is None:
        return "-"
    if before == 0:
        return "same" if after == 0 else "new"
    ratio = after / before
    arrow = "better" if (ratio < 1) == lower_better and ratio != 1 else "worse"
    return f"{ratio:.2f}x ({(ratio - 1) * 100:+.0f}%, {arrow if ratio != 1 else 'same'})"


def render_table(results: dict, base: str = "fifo", new: str = "mosaic") -> list:
    """[seed-style table (metric | base | new | change), full comparison table]."""
    pol = results["policies"]
    out: list = []
    title = (
        f"{results['trace']} on {results.get('cluster_description', results['cluster'])}, "
        f"{results['jobs']:,} jobs, offered load "
        f"{100 * (results['load']['offered_demand_over_capacity'] or 0):.0f}%"
    )
    if base in pol and new in pol:
        t = Table(title=title)
        t.add_column("metric")
        t.add_column(base, justify="right")
        t.add_column(new, justify="right")
        t.add_column("change", justify="right")
        for key, label, kind, lower in HEADLINE:
            b, a = pol[base].get(key), pol[new].get(key)
            t.add_row(label, fmt(b, kind), fmt(a, kind), change(b, a, lower))
        out.append(t)
    full = Table(title="all policies")
    full.add_column("metric")
    for name in pol:
        full.add_column(name, justify="right")
    for key, label, kind in FULL:
        full.add_row(label, *(fmt(pol[n].get(key), kind) for n in pol))
    bad = {n: m.get("bound_violations") for n, m in pol.items() if m.get("bound_violations")}
    out.append(full)
    if results.get("dropped_jobs"):
        out.append(
            f"dropped {results['dropped_jobs']} jobs for every policy: "
            f"{results.get('dropped_reasons')}"
        )
    if bad:
        out.append(f"[red]BOUND VIOLATIONS (a bug): {bad}[/red]")
    return out


def write_plots(results: dict, runs: dict[str, SimResult], out_dir: Path) -> list[Path]:
    """JCT CDF, utilization over time, queue over time, energy per policy (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    paths: list[Path] = []

    def save(fig, name: str) -> None:
        p = out_dir / name
        fig.tight_layout()
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, r in runs.items():
        jct = np.sort([j.end_s - j.submit_s for j in r.jobs if j.state == COMPLETED])
        if jct.size:
            ax.plot(jct / 3600.0, np.arange(1, jct.size + 1) / jct.size, label=name)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h, log)")
    ax.set_ylabel("share of jobs")
    ax.set_title("JCT CDF")
    ax.legend()
    save(fig, "jct_cdf.png")

    for attr, label, fname in (
        ("samples_util", "allocated GPUs / capacity", "utilization.png"),
        ("samples_queue", "jobs waiting", "queue.png"),
    ):
        fig, ax = plt.subplots(figsize=(8, 4))
        for name, r in runs.items():
            if r.samples_t.size:
                ax.plot((r.samples_t - r.t0_s) / 86400.0, getattr(r, attr), label=name, lw=0.8)
        ax.set_xlabel("days since first arrival")
        ax.set_ylabel(label)
        ax.legend()
        save(fig, fname)

    fig, ax = plt.subplots(figsize=(6, 4))
    names = list(results["policies"])
    kwh = [results["policies"][n]["energy_kwh"] or 0.0 for n in names]
    idle = [results["policies"][n]["energy_idle_kwh"] or 0.0 for n in names]
    ax.bar(names, idle, label="idle")
    ax.bar(names, [k - i for k, i in zip(kwh, idle, strict=True)], bottom=idle, label="active")
    ax.set_ylabel("energy (kWh)")
    ax.set_title(f"energy per policy (${results['tariff_usd_per_kwh']}/kWh)")
    ax.legend()
    save(fig, "energy.png")
    return paths
