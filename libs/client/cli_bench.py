"""``mosaic bench placer``: the live placer's decision path at cluster scale (one JSON line).

Why a child process: the benchmark drives the placer's own modules (``services.placer.bench``),
and ``libs`` never imports ``services``; the command line only starts it and passes its exit
status on.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Annotated

import typer

bench_app = typer.Typer(help="Benchmarks of the live services' decision paths.")


@bench_app.command("placer")
def placer(
    gpus: Annotated[int, typer.Option(help="cluster size in GPUs (the brief's node mix)")] = 1000,
    pending: Annotated[int, typer.Option(help="jobs queued at the start, and held")] = 10_000,
    seed: Annotated[int, typer.Option(help="seed of the job mix")] = 1,
    steady_cycles: Annotated[int, typer.Option(help="steady-state cycles measured")] = 60,
    json_out: Annotated[bool, typer.Option("--json", help="one JSON object on stdout")] = False,
) -> None:
    """Fill an empty cluster from a queue of PENDING jobs (placements_per_s), then hold the
    queue at PENDING while jobs end and arrive (cycle_p50_s, cycle_p99_s)."""
    args = [sys.executable, "-m", "services.placer.bench", f"--gpus={gpus}"]
    args += [f"--pending={pending}", f"--seed={seed}", f"--steady-cycles={steady_cycles}"]
    if json_out:
        args.append("--json")
    raise typer.Exit(subprocess.call(args))


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
