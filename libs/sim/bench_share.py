"""Sharing with and without the interference rule (issue 16), as one command:
``python -m libs.sim.bench_share [--trace openb --cluster openb --load 0.9] [--latency 90:100]``.

Runs mosaic with ``share_interference`` on and off (the simulator slows shared fractions by
the model in both) and prints the fractional jobs' figures (``libs.sim.sharing``).
``--latency SOLO:TARGET`` gives every fractional inference job of the trace a p99 target of
TARGET ms and a solo p99 of SOLO ms (no public trace carries latency targets: the figures are
the experiment's, not the trace's), so the report counts targets broken while sharing.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import msgspec

from libs.sim.runner import run_simulation
from libs.sim.trace import Trace


def with_latency(solo_ms: float, target_ms: float):  # type: ignore[no-untyped-def]
    """A trace transform: fractional inference jobs get ``solo_ms`` / ``target_ms``."""

    def stamp(tr: Trace) -> Trace:
        jobs = tuple(
            msgspec.structs.replace(
                j,
                spec=msgspec.structs.replace(
                    j.spec, latency_p99_ms=target_ms, solo_latency_p99_ms=solo_ms
                ),
            )
            if j.spec.gpus < 1 and j.spec.kind == "inference"
            else j
            for j in tr.jobs
        )
        return msgspec.structs.replace(tr, jobs=jobs)

    return stamp


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m libs.sim.bench_share")
    ap.add_argument("--trace", default="openb")
    ap.add_argument("--cluster", default="openb")
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--load", type=float, default=0.9)
    ap.add_argument("--latency", default=None, help="SOLO_MS:TARGET_MS for inference fractions")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args(argv)
    transform = None
    if args.latency:
        solo, target = (float(x) for x in args.latency.split(":"))
        transform = with_latency(solo, target)
    for on in ("true", "false"):
        r = run_simulation(
            args.trace, args.cluster, args.gpus, ["mosaic"], None, load=args.load,
            overrides=[*args.overrides, f"share_interference={on}"], trace_transform=transform,
        )  # fmt: skip
        m = r["policies"]["mosaic"]
        row = {"share_interference": on, **m["fractional"]}
        row |= {"queue_delay_mean_s": m["queue_delay_mean_s"], "jct_mean_s": m["jct_mean_s"]}
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
