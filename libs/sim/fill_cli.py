"""The command line of the fill experiment (``mosaic sim --fill F``): its flags (and ``--set``)
on the runner's parser, one ``run_fill`` per seed, a table of the allocation ratios at 100%
and at the fill."""

from __future__ import annotations

import argparse
from typing import Any

from libs.sim.fill_run import FILL_POLICIES, run_fill
from libs.sim.overrides import apply_overrides


def add_fill_args(ap: argparse.ArgumentParser) -> None:
    """The runner's flags for the fill experiment (``--fill``) and for overrides (``--set``)."""
    ap.add_argument(
        "--fill",
        type=float,
        default=None,
        help="FGD's fill experiment: pods arrive shuffled and never leave until the arrived GPU "
        "request is this x capacity (e.g. 1.3); needs --trace openb[:VARIANT] --cluster openb",
    )
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a PolicyConfig field for this run (repeatable; dotted for nested "
        "records, e.g. defrag.enabled=true)",
    )


def main_fill(args: argparse.Namespace, console: Any) -> int:
    """Run the fill experiment as ``args`` say; exit status."""
    from rich.table import Table

    names = [p.strip().lower() for p in (args.policies or ",".join(FILL_POLICIES)).split(",")]
    try:
        from libs.policy_io.policy_file import load_policy_file

        path = getattr(args, "policy_file", None)  # --policy-file, then --set on top
        cfg, overrides = apply_overrides(args.overrides, load_policy_file(path) if path else None)
        results = run_fill(
            args.trace,
            args.cluster,
            [n for n in names if n],
            args.out,
            fill=args.fill,
            seed=args.seed,
            traces_dir=args.traces_dir,
            cfg=cfg,
            overrides=overrides,
        )
    except (ValueError, FileNotFoundError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    top = str(int(args.fill * 100 + 1e-9))
    table = Table(title=f"fill {results['trace']} seed {results['seed']} ({results['gpus']} GPUs)")
    for col in ("policy", "alloc @100%", f"alloc @{top}%", "failed pods", "migrations"):
        table.add_column(col)
    for name, m in results["policies"].items():
        a = m["alloc_at_arrived"]
        at100 = f"{a['100']:.2%}" if "100" in a else "-"
        table.add_row(name, at100, f"{a[top]:.2%}", str(m["pods_failed"]), str(m["migrations"]))
    console.print(table)
    if args.out is not None:
        console.print(f"wrote {args.out / 'results.json'}")
    return 0
