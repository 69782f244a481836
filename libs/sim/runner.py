"""``mosaic sim``: replay one trace on one cluster under several policies and compare them.

``run_simulation`` is the function behind the CLI command (``libs.client.cli``) and
``python -m libs.sim.runner`` (same flags). It returns the ``results.json`` dict and, with an
output folder, writes that file and the PNG plots.

Every policy sees the same jobs: a job that no node can ever hold, or that one of the known
policies could never place (every policy spans nodes with a job wider than any node: Mosaic's
gangs, issue 15), is dropped for all of them, and the count and reasons are reported
(``dropped_jobs``). The rule reads the trace and the cluster only, never which policies run, so
a policy's figures are the same whether it runs alone or beside others; so is the energy window
(``metrics.rewindow``).
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from libs.policy import inventory
from libs.policy.profiles import ProfileTable
from libs.sim import metrics as M
from libs.sim.baselines import make_policy, parse_policies
from libs.sim.cluster import SimCluster
from libs.sim.clusters import resolve_cluster
from libs.sim.failures import FailureModel
from libs.sim.load import LOAD_BASES, scale_to_load
from libs.sim.loaders.noise import check_sigma, noise_report, noisy_estimates
from libs.sim.policy_run import PolicyRun
from libs.sim.power_saving import RULES as POWER_RULES
from libs.sim.power_saving import apply_mode, check_mode
from libs.sim.profile_error import profile_kwargs
from libs.sim.runner_args import parse_weights, runner_parser
from libs.sim.runtimes import runtime_matrix
from libs.sim.services import load_scenario
from libs.sim.serving import summary_lines
from libs.sim.state import SimResult
from libs.sim.thermal import HotNodes, summary_line
from proto.nodes import NodeSpec


def _feasible(trace_jobs, nodes) -> tuple[list[int], Counter]:
    """Indices of jobs every known policy could place on the empty cluster (whichever run:
    dropping a job only when Mosaic is compared would change the baselines' figures)."""
    from libs.policy.filters import NeverFits

    sim = SimCluster(nodes)
    never_fits = NeverFits(nodes)
    keep: list[int] = []
    why: Counter = Counter()
    for i, tj in enumerate(trace_jobs):
        if not sim.could_ever_fit(tj.spec, check_memory=True):
            why["no node can ever hold it"] += 1
            continue
        reason = never_fits(tj.spec)
        if reason is not None:
            why["mosaic: " + reason.split(":", 1)[0]] += 1
            continue
        keep.append(i)
    return keep, why


def _finite(x: Any) -> Any:
    """JSON has no NaN/inf: write null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    if isinstance(x, np.floating | np.integer):
        return _finite(x.item())
    return x


def run_simulation(
    trace: str,
    cluster: str,
    gpus: int,
    policies: list[str],
    out_dir: Path | None,
    seed: int = 0,
    max_jobs: int | None = None,
    load: float | None = None,
    throughputs: Path | None = None,
    progress: Callable[[str, float], None] | None = None,
    *,
    load_basis: str = "fastest",
    traces_dir: Path | None = None,
    tariff_usd_per_kwh: float = M.DEFAULT_TARIFF_USD_PER_KWH,
    failures: FailureModel | None = None,
    policy_kwargs: dict[str, dict] | None = None,
    keep_runs: dict[str, SimResult] | None = None,
    overrides: Sequence[str] = (),
    hot: HotNodes | None = None,
    power_saving: str = "mosaic",
    base_cfg: Any = None,
    window_s: tuple[float | None, float | None] | None = None,
    interference: bool = True,
    trace_transform: Callable[[Any], Any] | None = None,
    estimate_noise: float = 0.0,
    services: Path | None = None,
) -> dict:
    """Replay ``trace`` on ``cluster`` under each policy; the ``results.json`` dict.

    ``load``: scale arrivals so that offered demand (GPUs x fastest-GPU runtime, summed) over
    the arrival span is this share of the cluster's capacity. ``load_basis`` says which
    capacity: "fastest" (every GPU counts as one reference GPU: on a mixed cluster the real
    occupancy is higher than ``load``) or "effective" (each GPU counts at its speed relative to
    the job's fastest model, averaged over the trace's work mix; see ``effective_capacity``).
    ``progress(policy, fraction)`` is called as each run advances. ``keep_runs``, when given,
    receives each policy's raw run. ``overrides``: ``KEY=VALUE`` settings of Mosaic's
    ``PolicyConfig`` (``libs.sim.overrides``), recorded in the results as ``overrides``.
    ``hot``: a hot-node scenario (``libs.sim.thermal``): each policy's ``thermal`` figures, and
    mosaic run again without its guard for ``thermal``. ``power_saving``: who may suspend
    idle nodes (``libs.sim.power_saving``: mosaic, all or none), recorded as ``power_saving``.
    mosaic run again without its guard for ``thermal``. ``base_cfg``: Mosaic's config before
    ``overrides`` (a ``--policy-file``, a calibration trial). ``window_s``: replay only the
    jobs submitted in ``[start, end)`` (``Trace.slice``, re-based to 0; after ``max_jobs``).
    ``estimate_noise``: sigma of the lognormal factor (median one) each job's ``est_runtime_s``
    is multiplied by, seeded by ``seed`` (``libs.sim.loaders.noise``); the true runtimes stay.
    ``services``: a scenario file of inference services and their load curves
    (``libs.sim.services``); every policy replays them (``libs.sim.serving``), each policy's
    ``services`` figures say how they fared, and its other figures count training jobs only.
    """
    from libs.sim.loaders import load_trace
    from libs.sim.overrides import apply_overrides

    cfg, overrides_set = apply_overrides(overrides, base_cfg)
    if overrides_set or base_cfg is not None:
        policy_kwargs = dict(policy_kwargs or {})
        for name in ("mosaic", "mosaic-np"):
            policy_kwargs[name] = {"cfg": cfg, **policy_kwargs.get(name, {})}

    names = parse_policies(policies)
    _check_options(power_saving, estimate_noise, load, load_basis)
    tr = load_trace(
        trace, traces_dir=traces_dir, seed=seed, max_jobs=max_jobs, throughputs=throughputs
    )
    if window_s is not None:
        tr = tr.slice(start_s=window_s[0], end_s=window_s[1])
    if trace_transform is not None:  # an experiment's change to the jobs (libs.sim.bench_share)
        tr = trace_transform(tr)
    if not tr.jobs:
        raise ValueError(f"trace {trace!r} has no jobs")
    nodes = resolve_cluster(cluster, gpus, tr)
    profiles = ProfileTable.default()
    for n in nodes:
        profiles = profiles.estimate_for(n)
    models = SimCluster(nodes).models
    keep, dropped = _feasible(tr.jobs, nodes)
    jobs = [tr.jobs[i] for i in keep]
    if not jobs:
        raise ValueError("no job of the trace fits this cluster")
    rt = runtime_matrix(jobs, models, profiles)
    capacity = float(sum(n.gpu_count for n in nodes))
    jobs, load_record = scale_to_load(jobs, rt, models, nodes, load, load_basis)
    # after the truth (runtimes, load) is fixed: only what the policies are told changes
    jobs = noisy_estimates(jobs, estimate_noise, seed)
    results = _header(
        trace, cluster, nodes, seed, jobs, dropped, load_record, tariff_usd_per_kwh, failures,
        overrides_set, power_saving, base_cfg, noise_report(jobs, estimate_noise, seed), tr,
    )  # fmt: skip
    if drf_weights := (policy_kwargs or {}).get("drf", {}).get("weights"):
        results["drf_weights"] = dict(drf_weights)  # a policy's options are part of the run
    runs = keep_runs if keep_runs is not None else ({} if out_dir is not None else None)
    idle_w = sum(profiles.idle_power_w(n.gpu_model) * n.gpu_count for n in nodes)
    # build every policy first: each imports its code now, so one run uses one version of it
    built = {n: make_policy(n, **(policy_kwargs or {}).get(n, {})) for n in names}
    built = {n: apply_mode(n, p, power_saving, cfg) for n, p in built.items()}
    loads = load_scenario(services) if services is not None else []
    setup = PolicyRun(
        jobs, nodes, profiles, rt, models, capacity, idle_w, cfg, failures, hot, interference,
        loads, tariff_usd_per_kwh,
    )  # fmt: skip
    for name in names:
        cb = (lambda f, _n=name: progress(_n, f)) if progress is not None else None
        m, run, guard = setup.run(built[name], results, cb)
        results["policies"][name] = m
        if guard is not None:
            results["thermal"] = guard
        if runs is not None:
            runs[name] = run
    return _finish(results, runs, out_dir)


def _header(
    trace: str, cluster: str, nodes: Sequence[NodeSpec], seed: int, jobs: list, dropped: Counter,
    load_record: dict, tariff_usd_per_kwh: float, failures: FailureModel | None,
    overrides_set: dict, power_saving: str, base_cfg: Any, noise: dict, tr: Any,
) -> dict[str, Any]:  # fmt: skip
    """``results.json`` before any policy ran: what was replayed, on what, under which rules."""
    capacity = float(sum(n.gpu_count for n in nodes))
    return {
        "trace": trace,
        "cluster": cluster,
        "cluster_description": inventory.describe(nodes),
        "gpus": int(capacity),
        "seed": seed,
        "jobs": len(jobs),
        "dropped_jobs": sum(dropped.values()),
        "dropped_reasons": dict(dropped),
        "load": load_record,
        "tariff_usd_per_kwh": tariff_usd_per_kwh,
        "failure_model": vars(failures or FailureModel()),
        "overrides": overrides_set,
        "power_saving": {"mode": power_saving, "rule": POWER_RULES[power_saving]},
        "base_policy": None if base_cfg is None else _policy_diff(base_cfg),
        "estimate_noise": noise,
        "assumptions": list(tr.assumptions),
        "bounds": {},
        "policies": {},
    }


def _check_options(
    power_saving: str, estimate_noise: float, load: float | None, load_basis: str
) -> None:
    """Refuse, before any trace is read, the options no replay can run with."""
    check_mode(power_saving)
    check_sigma(estimate_noise)
    if load is not None and not (math.isfinite(load) and load > 0):
        raise ValueError(f"load must be a positive number, got {load}")
    if load_basis not in LOAD_BASES:
        raise ValueError(f"load_basis must be one of {LOAD_BASES}, got {load_basis!r}")


def _finish(results: dict, runs: dict | None, out_dir: Path | None) -> dict:
    """Every policy's energy over the one window, finite numbers only, and with ``out_dir``
    the plots and ``results.json`` written there."""
    window = M.energy_window_s(results["bounds"])
    results["energy_window"] = {"energy_window_s": window, "rule": M.ENERGY_WINDOW_RULE}
    results["policies"] = {n: M.rewindow(m, window) for n, m in results["policies"].items()}
    results = _finite(results)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        from libs.sim.report import write_plots

        results["plots"] = [p.name for p in write_plots(results, runs or {}, out)]
        (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def _policy_diff(cfg: Any) -> dict[str, Any]:
    from libs.policy_io.policy_file import policy_diff

    return policy_diff(cfg)


def main(argv: Sequence[str] | None = None) -> int:
    ap = runner_parser()
    args = ap.parse_args(argv)
    from rich.console import Console
    from rich.progress import Progress

    from libs.sim.report import render_table

    console = Console()
    if args.fill is not None:
        from libs.sim.fill_cli import main_fill

        return main_fill(args, console)
    runs: dict[str, SimResult] = {}
    try:
        from libs.policy_io.policy_file import load_policy_file

        base = load_policy_file(args.policy_file) if args.policy_file is not None else None
        with Progress(console=console, transient=True) as bar:
            tasks: dict[str, Any] = {}

            def progress(policy: str, frac: float) -> None:
                if policy not in tasks:
                    tasks[policy] = bar.add_task(policy, total=1.0)
                bar.update(tasks[policy], completed=frac)

            results = run_simulation(
                args.trace,
                args.cluster,
                args.gpus,
                parse_policies(args.policies or "fifo,drf,tiresias,gavel,mosaic"),
                args.out,
                seed=args.seed,
                max_jobs=args.max_jobs,
                load=args.load,
                load_basis=args.load_basis,
                throughputs=args.throughputs,
                progress=progress,
                traces_dir=args.traces_dir,
                tariff_usd_per_kwh=args.tariff,
                keep_runs=runs,
                overrides=args.overrides,
                hot=HotNodes.parse(args.hot_nodes, args.hot_share, args.hot_heat),
                power_saving=args.power_saving,
                policy_kwargs=policy_kwargs(args),
                base_cfg=base,
                interference=not args.no_interference,
                estimate_noise=args.estimate_noise,
                services=args.services,
            )
    except (ValueError, FileNotFoundError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    for part in render_table(results):
        console.print(part)
    if (line := summary_line(results)) is not None:
        console.print(line, highlight=False)
    for line in summary_lines(results):  # inference services (--services)
        console.print(line, highlight=False)
    if args.out is not None:
        console.print(f"wrote {args.out / 'results.json'} and plots")
    return 0


def policy_kwargs(args: Any) -> dict[str, dict]:
    """The policies' constructor options from the flags: Mosaic's profile error and learning
    (``libs.sim.profile_error``), drf's tenant weights."""
    out = profile_kwargs(args)
    weights = parse_weights(args.drf_weights)
    if weights:
        out["drf"] = {"weights": weights}
    return out


if __name__ == "__main__":
    sys.exit(main())
