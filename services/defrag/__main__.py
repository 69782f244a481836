"""``python -m services.defrag [--interval-s S]`` (plus the common flags)."""

from __future__ import annotations

import argparse

from libs.bus.runtime import common_arg_parser, env_float, run_service
from services.defrag.service import main


def _validate(args: argparse.Namespace) -> None:
    if not args.interval_s > 0:
        raise ValueError("--interval-s must be > 0")


if __name__ == "__main__":
    parser = common_arg_parser("defrag")
    parser.add_argument(
        "--interval-s",
        type=float,
        default=env_float("MOSAIC_DEFRAG_INTERVAL_S", "5"),
        help="wall seconds between planning rounds",
    )
    run_service("defrag", main, parser=parser, validate=_validate)
