"""The replay's command line (``python -m libs.sim.runner``, ``mosaic sim``): every flag in
one parser, so the two entry points never drift apart."""

from __future__ import annotations

import argparse
from pathlib import Path

from libs.sim import metrics as M
from libs.sim.clusters import CLUSTERS
from libs.sim.fill_cli import add_fill_args
from libs.sim.load import LOAD_BASES
from libs.sim.loaders.noise import add_noise_args
from libs.sim.power_saving import MODES as POWER_MODES
from libs.sim.profile_error import add_profile_args


def add_hot_args(ap: argparse.ArgumentParser) -> None:
    """The hot-node scenario's flags (``libs.sim.thermal.HotNodes``)."""
    ap.add_argument("--hot-nodes", default=None, help="nodes that run hot, e.g. a100-0,a100-1")
    ap.add_argument("--hot-share", type=float, default=None, help="or this share of the nodes")
    ap.add_argument("--hot-heat", type=float, default=None, help="their heat factor (1.5)")


def runner_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m libs.sim.runner``."""
    ap = argparse.ArgumentParser(
        prog="python -m libs.sim.runner", description="Replay a trace under several policies."
    )
    ap.add_argument(
        "--trace",
        default="philly",
        help="philly, chronus, openb, helios, gavel:FILE, synthetic[:N]",
    )
    ap.add_argument("--cluster", default="seed", help=", ".join(CLUSTERS))
    ap.add_argument("--gpus", type=int, default=1024, help="size of the seed cluster")
    ap.add_argument(
        "--policies",
        default=None,
        help="default fifo,drf,tiresias,gavel,mosaic; also gavel-fifo, las, and NAME-np without "
        "preemption (libs.sim.baselines) (with --fill: random,bestfit,fgd,mosaic,mosaic+defrag)",
    )
    add_fill_args(ap)
    ap.add_argument("--out", type=Path, default=None, help="folder for results.json and plots")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-jobs", type=int, default=None)
    ap.add_argument(
        "--load",
        type=float,
        default=None,
        help="scale arrivals to this offered demand / capacity (e.g. 0.9)",
    )
    ap.add_argument(
        "--load-basis",
        choices=LOAD_BASES,
        default="fastest",
        help="capacity --load is measured against: every GPU as one fastest GPU, or each GPU "
        "at its speed relative to the fastest (effective)",
    )
    ap.add_argument(
        "--throughputs",
        type=Path,
        default=None,
        help="Gavel simulation_throughputs.json (for gavel:FILE traces)",
    )
    ap.add_argument("--traces-dir", type=Path, default=None)
    ap.add_argument(
        "--power-saving",
        choices=POWER_MODES,
        default="mosaic",
        help="who may suspend idle nodes: mosaic only (default), all policies by the same "
        "rule, or none",
    )
    ap.add_argument(
        "--tariff",
        type=float,
        default=M.DEFAULT_TARIFF_USD_PER_KWH,
        help="energy price, USD per kWh",
    )
    add_hot_args(ap)
    add_profile_args(ap)
    add_noise_args(ap)
    ap.add_argument("--policy-file", type=Path, default=None, help="policy.json (calibrate)")
    ap.add_argument(
        "--drf-weights",
        default=None,
        metavar="TENANT=W,...",
        help="drf's tenant weights (weighted DRF; a tenant not named weighs 1)",
    )
    ap.add_argument(
        "--no-interference",
        action="store_true",
        help="co-located fractions run at full speed (libs.sim.sharing off); the policy's own "
        "rule is --set share_interference=false",
    )
    ap.add_argument(
        "--services",
        type=Path,
        default=None,
        help="inference services and their load curves (JSON, libs.sim.services)",
    )
    return ap


def parse_weights(text: str | None) -> dict[str, float]:
    """``--drf-weights a=2,b=0.5`` as {tenant: weight}; a clear error naming the bad part."""
    out: dict[str, float] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        tenant, sep, value = part.partition("=")
        try:
            w = float(value)
        except ValueError:
            w = float("nan")
        if not sep or not tenant.strip() or not (w > 0 and w != float("inf")):
            raise ValueError(f"--drf-weights: {part.strip()!r} is not TENANT=W with W > 0")
        out[tenant.strip()] = w
    return out
