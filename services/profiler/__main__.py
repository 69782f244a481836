"""``python -m services.profiler [--alpha A] [--min-samples N] [--outlier-factor F]`` (plus the
common flags). Defaults: ``libs.policy.profile_learning.LearningConfig``, or the environment
(``MOSAIC_PROFILER_ALPHA``, ``_MIN_SAMPLES``, ``_OUTLIER_FACTOR``)."""

from __future__ import annotations

from libs.bus.runtime import common_arg_parser, env_float, run_service
from libs.policy.profile_learning import LearningConfig
from services.profiler.service import main, validate

if __name__ == "__main__":
    d = LearningConfig()
    parser = common_arg_parser("profiler")
    parser.add_argument(
        "--alpha",
        type=float,
        default=env_float("MOSAIC_PROFILER_ALPHA", str(d.alpha)),
        help="EWMA weight of a new observation once an entry counts",
    )
    parser.add_argument(
        "--min-samples",
        type=int,
        default=int(env_float("MOSAIC_PROFILER_MIN_SAMPLES", str(d.min_samples))),
        help="completed jobs before an entry counts (their median seeds it)",
    )
    parser.add_argument(
        "--outlier-factor",
        type=float,
        default=env_float("MOSAIC_PROFILER_OUTLIER_FACTOR", str(d.outlier_factor)),
        help="an observation is clipped to within this factor of the estimate",
    )
    run_service("profiler", main, parser=parser, validate=validate)
