"""``python -m services.placer [--lease-ttl-s S] [--tick-s S]`` (plus the common flags)."""

from __future__ import annotations

import argparse

from libs.bus.runtime import common_arg_parser, env_float, run_service
from services.placer.service import main


def _validate(args: argparse.Namespace) -> None:
    if args.lease_ttl_s <= 0 or args.tick_s <= 0 or args.debounce_s < 0 or args.settle_s < 0:
        raise ValueError("--lease-ttl-s and --tick-s must be > 0, --debounce-s/--settle-s >= 0")
    if args.lost_after_reports < 1 or args.down_after_intervals <= 0:
        raise ValueError("--lost-after-reports must be >= 1, --down-after-intervals > 0")


if __name__ == "__main__":
    parser = common_arg_parser("placer")
    parser.add_argument(
        "--lease-ttl-s",
        type=float,
        default=env_float("MOSAIC_PLACER_LEASE_TTL_S", "5"),
        help="lease time-to-live: a crashed active is replaced within this (wall s)",
    )
    parser.add_argument(
        "--tick-s",
        type=float,
        default=env_float("MOSAIC_PLACER_TICK_S", "2"),
        help="a placement cycle at least this often (wall s)",
    )
    parser.add_argument(
        "--debounce-s", type=float, default=env_float("MOSAIC_PLACER_DEBOUNCE_S", "0.05")
    )
    parser.add_argument(
        "--settle-s",
        type=float,
        default=env_float("MOSAIC_PLACER_SETTLE_S", "2"),
        help="node set unchanged this long before refusing a job no node can hold",
    )
    parser.add_argument(
        "--lost-after-reports",
        type=int,
        default=int(env_float("MOSAIC_PLACER_LOST_AFTER_REPORTS", "3")),
        help="requeue a started job after this many reports of its node omit it",
    )
    parser.add_argument(
        "--down-after-intervals",
        type=float,
        default=env_float("MOSAIC_PLACER_DOWN_AFTER_INTERVALS", "3"),
        help="a node silent for this many report intervals is down (its jobs requeued)",
    )
    parser.add_argument("--holder", default="", help="lease holder id (default host-pid-random)")
    parser.add_argument(
        "--no-power-saving",
        action="store_true",
        help="never suspend idle nodes (for executors that cannot act on power commands)",
    )
    run_service("placer", main, parser=parser, validate=_validate)
