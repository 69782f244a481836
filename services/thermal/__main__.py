"""``python -m services.thermal [--threshold-c C] [--clear-c C] [--window N] [--max-moves N]``
(plus the common flags). Defaults: ``libs.policy.config.ThermalConfig``, or the environment
(``MOSAIC_THERMAL_THRESHOLD_C``, ``_CLEAR_C``, ``_WINDOW``, ``_MAX_MOVES``)."""

from __future__ import annotations

from libs.bus.runtime import common_arg_parser, env_float, run_service
from libs.policy.config import ThermalConfig
from services.thermal.service import main, validate

if __name__ == "__main__":
    d = ThermalConfig()
    parser = common_arg_parser("thermal")
    parser.add_argument(
        "--threshold-c",
        type=float,
        default=env_float("MOSAIC_THERMAL_THRESHOLD_C", str(d.threshold_c)),
        help="a GPU at or above this for a window of samples makes its node hot",
    )
    parser.add_argument(
        "--clear-c",
        type=float,
        default=env_float("MOSAIC_THERMAL_CLEAR_C", str(d.clear_c)),
        help="a hot node is released once every GPU is below this for a window",
    )
    parser.add_argument(
        "--window",
        type=int,
        default=int(env_float("MOSAIC_THERMAL_WINDOW", str(d.window))),
        help="consecutive telemetry samples that make a trend",
    )
    parser.add_argument(
        "--max-moves",
        type=int,
        default=int(env_float("MOSAIC_THERMAL_MAX_MOVES", str(d.max_moves_per_window))),
        help="migrations asked per hot node per window",
    )
    run_service("thermal", main, parser=parser, validate=validate)
