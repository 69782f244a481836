"""``mosaic calibrate``: the command line of the offline calibration (``libs.calibrate``).

Why a module of its own: the ``mosaic`` CLI stays a list of commands; this one's flags, its
progress bar and its summary live here, and optuna is imported only when the command runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console


def register(app: typer.Typer) -> None:
    """Add ``mosaic calibrate`` to ``app``."""
    app.command()(calibrate)


def calibrate(
    out: Annotated[Path, typer.Option("--out", help="folder: study, peers, policy.json, report")],
    trace: Annotated[str, typer.Option("--trace", help="philly, synthetic:N, ...")] = "philly",
    cluster: Annotated[str, typer.Option("--cluster", help="seed, counts or a file")] = "seed",
    gpus: Annotated[int | None, typer.Option("--gpus", help="size of the seed cluster")] = None,
    max_jobs: Annotated[int | None, typer.Option("--max-jobs")] = None,
    load: Annotated[float | None, typer.Option("--load", help="offered load of each part")] = None,
    load_basis: Annotated[str, typer.Option("--load-basis", help="fastest or effective")] = (
        "fastest"
    ),
    seed: Annotated[int, typer.Option("--seed", help="trace fill seed")] = 0,
    power_saving: Annotated[
        str, typer.Option("--power-saving", help="who may suspend nodes: all, mosaic or none")
    ] = "all",
    radius: Annotated[
        float, typer.Option("--radius", help="share of each range searched around the default")
    ] = 1.0,
    train_seeds: Annotated[
        int, typer.Option("--train-seeds", help="fill seeds each config is scored on (mean)")
    ] = 1,
    traces_dir: Annotated[Path | None, typer.Option("--traces-dir")] = None,
    trials: Annotated[int, typer.Option("--trials", help="trials in the study, in all")] = 40,
    workers: Annotated[
        int | None, typer.Option("--workers", help="processes (default: the CPU count)")
    ] = None,
    holdout_frac: Annotated[
        float, typer.Option("--holdout-frac", help="the later share of jobs held out")
    ] = 0.3,
    objective: Annotated[
        str | None, typer.Option("--objective", help='weights: JSON or "k=v,k=v"')
    ] = None,
    sampler_seed: Annotated[int, typer.Option("--sampler-seed", help="TPE's seed")] = 0,
) -> None:
    """Search every coefficient of the policy on the earlier part of a trace; report on the
    later part; write DIR/policy.json (for --policy-file) and DIR/report.json."""
    from libs.calibrate.evaluate import Setup
    from libs.calibrate.objective import parse_objective
    from libs.calibrate.report import calibrate as run
    from libs.calibrate.study import Plan

    err = Console(stderr=True)
    try:
        plan = Plan(
            setup=Setup(
                trace=trace,
                cluster=cluster,
                gpus=gpus,
                max_jobs=max_jobs,
                load=load,
                load_basis=load_basis,
                seed=seed,
                holdout_frac=holdout_frac,
                power_saving=power_saving,
                radius=radius,
                train_seeds=train_seeds,
                traces_dir=str(traces_dir) if traces_dir is not None else None,
                objective=parse_objective(objective).as_dict(),
            ),
            out=out,
            trials=trials,
            workers=workers if workers is not None else (os.cpu_count() or 1),
            sampler_seed=sampler_seed,
        )
        report = _with_bar(plan, err, run)
    except (ValueError, FileNotFoundError) as exc:
        from libs.client.cli import UsageProblem

        raise UsageProblem(str(exc)) from None
    console = Console()
    for part in ("train", "holdout"):
        r = report[part]
        console.print(
            f"{part:8s} default {r['default']:.4f}  calibrated {r['calibrated']:.4f}  "
            f"(lower is better; 1.0 = the best peer on every term)",
            highlight=False,
        )
    console.print(
        f"{report['trials']} trials, {report['wall_s']:.0f} s; policy in {out / 'policy.json'}",
        highlight=False,
    )


def _with_bar(plan: Any, err: Console, run: Any) -> dict:
    """``run(plan, progress)`` under a rich progress bar of trials done."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
    with Progress(*columns, TextColumn("best {task.fields[best]}"), console=err) as bar:
        task = bar.add_task("calibrating", total=plan.trials, best="-")

        def progress(n_done: int, total: int, best: float | None) -> None:
            shown = "-" if best is None else f"{best:.4f}"
            bar.update(task, completed=min(n_done, total), total=total, best=shown)

        return run(plan, progress)
