"""``mosaic sim``: replay a trace through the simulator under several policies, and the table.

Apart from the entry point (``libs.client.cli``): the one command that runs the simulator in
process. It imports the simulator lazily, so the live commands work without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from libs.client.errors import Unavailable, UsageProblem

out = Console()
err = Console(stderr=True)

SIM_POLICIES = "fifo,drf,tiresias,gavel,mosaic"


def sim(
    trace: Annotated[
        str, typer.Option("--trace", help="philly, helios, alibaba, synthetic...")
    ] = "philly",
    cluster: Annotated[str, typer.Option("--cluster", help="seed, counts or a file")] = "seed",
    gpus: Annotated[int, typer.Option("--gpus")] = 1024,
    policies: Annotated[str, typer.Option("--policies")] = SIM_POLICIES,
    out_dir: Annotated[Path, typer.Option("--out", help="results folder")] = Path("results/sim"),
    seed: Annotated[int, typer.Option("--seed")] = 0,
    max_jobs: Annotated[int | None, typer.Option("--max-jobs")] = None,
    load: Annotated[float | None, typer.Option("--load")] = None,
    load_basis: Annotated[
        str,
        typer.Option(
            "--load-basis",
            help="capacity --load is measured against: fastest (every GPU as one fastest GPU) "
            "or effective (each GPU at its speed relative to the fastest)",
        ),
    ] = "fastest",
    power_saving: Annotated[
        str,
        typer.Option(
            "--power-saving",
            help="who may suspend idle nodes: mosaic (default), all (every policy, the same "
            "rule) or none",
        ),
    ] = "mosaic",
    throughputs: Annotated[Path | None, typer.Option("--throughputs")] = None,
    fill: Annotated[
        float | None, typer.Option("--fill", help="FGD's fill experiment up to this x capacity")
    ] = None,
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="KEY=VALUE of PolicyConfig (repeatable)")
    ] = None,
    traces_dir: Annotated[Path | None, typer.Option("--traces-dir")] = None,
    hot_nodes: Annotated[
        str | None, typer.Option("--hot-nodes", help="hot-node scenario: nodes that run hot")
    ] = None,
    hot_share: Annotated[
        float | None, typer.Option("--hot-share", help="or this share of the nodes")
    ] = None,
    hot_heat: Annotated[
        float | None, typer.Option("--hot-heat", help="their heat factor (default 1.5)")
    ] = None,
    policy_file: Annotated[
        Path | None, typer.Option("--policy-file", help="Mosaic's policy.json (calibrate)")
    ] = None,
    estimate_noise: Annotated[
        float,
        typer.Option(
            "--estimate-noise",
            metavar="SIGMA",
            help="multiply each job's runtime estimate (what the policies see) by a lognormal "
            "factor of median 1 and this log-sigma, seeded by --seed; true runtimes unchanged",
        ),
    ] = 0.0,
    services: Annotated[
        Path | None,
        typer.Option("--services", help="inference services and load curves (libs.sim.services)"),
    ] = None,
    drf_weights: Annotated[
        str | None,
        typer.Option("--drf-weights", metavar="TENANT=W,...", help="drf's tenant weights"),
    ] = None,
) -> None:
    """Replay a trace through the simulator under several policies and compare them."""
    if fill is not None:  # the runner's own command line runs the fill experiment
        argv = ["--trace", trace, "--cluster", cluster, "--seed", str(seed), "--out", str(out_dir)]
        argv += ["--fill", str(fill), "--policies", policies if policies != SIM_POLICIES else ""]
        argv += [x for kv in overrides or [] for x in ("--set", kv)]
        argv += ["--traces-dir", str(traces_dir)] if traces_dir is not None else []
        argv += ["--policy-file", str(policy_file)] if policy_file is not None else []
        _fill(argv)
        return
    try:
        from libs.sim.runner import run_simulation
        from libs.sim.runner_args import parse_weights
    except ImportError as exc:
        raise Unavailable(f"the simulator is not available: {exc}") from None
    from rich.progress import Progress

    names = [p.strip() for p in policies.split(",") if p.strip()]
    if not names:
        raise UsageProblem("--policies is empty")
    with Progress(console=err, transient=True) as bar:
        tasks: dict[str, object] = {}

        def progress(policy: str, fraction: float) -> None:
            """One bar per policy, as ``run_simulation`` reports (policy, fraction done)."""
            if policy not in tasks:
                tasks[policy] = bar.add_task(f"simulating {policy}", total=1.0)
            bar.update(tasks[policy], completed=fraction)  # type: ignore[arg-type]

        try:
            weights = parse_weights(drf_weights)
            results = run_simulation(
                trace,
                cluster,
                gpus,
                names,
                out_dir,
                seed=seed,
                max_jobs=max_jobs,
                load=load,
                load_basis=load_basis,
                power_saving=power_saving,
                throughputs=throughputs,
                progress=progress,
                traces_dir=traces_dir,
                overrides=overrides or (),
                hot=_hot_scenario(hot_nodes, hot_share, hot_heat),
                base_cfg=_policy(policy_file),
                estimate_noise=estimate_noise,
                services=services,
                policy_kwargs={"drf": {"weights": weights}} if weights else None,
            )
        except (ValueError, FileNotFoundError) as exc:
            raise UsageProblem(str(exc)) from None
    _show(results, out_dir)


def _fill(argv: list[str]) -> None:
    """FGD's fill experiment (``--fill``), run by the runner's own command line."""
    from libs.sim.runner import main as runner_main

    code = runner_main(argv)
    if code:
        raise typer.Exit(code)


def _show(results: dict, out_dir: Path) -> None:
    """The comparison table, the hot-node and inference lines, and where the results are."""
    from libs.sim.report import render_table
    from libs.sim.serving import summary_lines
    from libs.sim.thermal import summary_line

    rendered = render_table(results)
    for part in rendered if isinstance(rendered, list | tuple) else [rendered]:
        out.print(part)
    if (line := summary_line(results)) is not None:
        out.print(line, highlight=False)
    for line in summary_lines(results):  # inference services (--services)
        out.print(line, highlight=False)
    out.print(f"results in {out_dir}", highlight=False)


def _policy(path: Path | None):
    """The policy of ``--policy-file``, or None (the defaults)."""
    if path is None:
        return None
    from libs.policy_io.policy_file import load_policy_file

    try:
        return load_policy_file(path)
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None


def _hot_scenario(names: str | None, share: float | None, heat: float | None):
    """``mosaic sim``'s hot-node scenario (``libs.sim.thermal``), or None."""
    from libs.sim.thermal import HotNodes

    try:
        return HotNodes.parse(names, share, heat)
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None


def register(app: typer.Typer) -> None:
    """Add ``mosaic sim`` to ``app``."""
    app.command()(sim)
