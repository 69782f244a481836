"""``python -m services.scorer [--rescore-s S] [--debounce-s S]`` (plus the common flags).

The flags keep their names (manifests and ``mosaic up`` pass them); a round now scores the
newcomers and refreshes the gauges instead of re-ranking the queue."""

from __future__ import annotations

import argparse

from libs.bus.runtime import common_arg_parser, env_float, run_service
from services.scorer.service import main


def _validate(args: argparse.Namespace) -> None:
    if args.rescore_s <= 0 or args.debounce_s < 0:
        raise ValueError("--rescore-s must be > 0 and --debounce-s >= 0")


if __name__ == "__main__":
    parser = common_arg_parser("scorer")
    parser.add_argument(
        "--rescore-s",
        type=float,
        default=env_float("MOSAIC_SCORER_RESCORE_S", "2"),
        help="wall seconds between rounds when nothing changes (the load gauges)",
    )
    parser.add_argument(
        "--debounce-s",
        type=float,
        default=env_float("MOSAIC_SCORER_DEBOUNCE_S", "0.1"),
        help="quiet wall seconds after a change before scoring the newcomers",
    )
    run_service("scorer", main, parser=parser, validate=_validate)
