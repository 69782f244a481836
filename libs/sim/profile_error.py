"""``--profile-error X``: the policy's profile table wrong by up to ±X, the truth left alone.

Why: the scheduler's table is an estimate (datasheets, published benchmarks), and the live
cluster runs at its own speeds. The simulator's engine keeps running the truth (its runtime
matrix and energy come from the exact table); only the table the policy schedules with is
perturbed, so learning (``libs.policy.profile_learning``) has something to recover and the
cost of a wrong table is measurable against the exact-profile run.

Each (model, class) entry of the cluster's models gets its speed and its power each
multiplied by its own factor drawn uniformly from [1 - X, 1 + X], seeded, so a run is
repeatable and different seeds give different wrong tables.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from libs.policy.profiles import ProfileEntry, ProfileTable
from proto.jobs import WORKLOAD_CLASSES

MAX_ERROR = 0.9  # a factor of 1 - X must stay positive: a speed of 0 is no table


def perturbed(table: ProfileTable, models: Sequence[str], error: float, seed: int) -> ProfileTable:
    """``table`` (covering ``models``) with each (model, class) speed and power off by a seeded
    factor in [1 - error, 1 + error]; ``error`` 0 returns ``table`` itself."""
    if not (math.isfinite(error) and 0.0 <= error <= MAX_ERROR):
        raise ValueError(f"profile error must be in [0, {MAX_ERROR}], got {error}")
    if error == 0.0:
        return table
    rng = np.random.default_rng([seed, 15])
    entries = dict(table.entries)
    for m in sorted(models):
        for c in WORKLOAD_CLASSES:
            e = table.entry(m, c)
            fs, fp = rng.uniform(1.0 - error, 1.0 + error, size=2)
            src = f"perturbed ±{error:g} (sim): {e.source}"
            entries[(m, c)] = ProfileEntry(e.speed * fs, e.power_w * fp, src, e.estimated)
    return ProfileTable(MappingProxyType(entries), table.idle_w, table.reference_model)


def log_error(policy: ProfileTable, truth: ProfileTable, models: Sequence[str]) -> float:
    """Mean |log(policy speed / true speed)| over the models and classes: 0 is exact."""
    errs = [
        abs(math.log(policy.speed(m, c) / truth.speed(m, c)))
        for m in models
        for c in WORKLOAD_CLASSES
    ]
    return float(np.mean(errs)) if errs else 0.0


def add_profile_args(ap: Any) -> None:
    """The runner's flags of the profile experiment (issue 15)."""
    ap.add_argument(
        "--profile-error",
        type=float,
        default=0.0,
        help="make Mosaic's profile table wrong by up to ±X (seeded; the truth is unchanged)",
    )
    ap.add_argument(
        "--profile-learning",
        choices=("on", "off"),
        default="off",
        help="Mosaic learns speed and power from completed jobs (the live profiler's rule)",
    )


def profile_kwargs(args: Any) -> dict[str, dict]:
    """``policy_kwargs`` for ``run_simulation`` from those flags (empty: the exact table)."""
    if args.profile_error == 0.0 and args.profile_learning == "off":
        return {}
    return {
        "mosaic": {
            "profile_error": args.profile_error,
            "profile_learning": args.profile_learning == "on",
            "profile_seed": args.seed,
        }
    }
