"""The search space of ``mosaic calibrate``: every coefficient of ``PolicyConfig`` with its range.

Why one table beside the config and not a hand list in the optimizer: the space must follow the
config. Every leaf field of ``PolicyConfig`` (nested records included, by dotted name) is either
a coefficient here (``BOUNDS``: its range and scale) or excluded by name with the reason
(``EXCLUDED``); ``check_covers`` fails on a field that is neither, so a new coefficient cannot
be added to the config and silently left out of calibration (tests/calibrate/test_space.py).

Ranges hold the default (a trial at the defaults is always possible: the study's first trial)
and stay inside what each record's checks accept. Log scale for quantities whose effect is by
ratio (times, rates, weights spanning decades), linear for shares and weights in [0, 1].

The three regimes' weights (``weights_low`` ...) are sampled raw in [0, 1] and scaled to sum 1
(``to_values``): ``RegimeWeights`` says they sum to 1 so scores stay comparable between regimes.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from libs.policy.config import REGIMES, PolicyConfig

H = 3600.0
DAY = 86_400.0


@dataclass(frozen=True, slots=True)
class Bound:
    """The range of one coefficient: ``low``..``high``, on a log or linear scale; an int field
    is sampled as an int."""

    low: float
    high: float
    log: bool = False

    def __post_init__(self) -> None:
        if not self.low < self.high:
            raise ValueError(f"bound: need low < high, got {self.low}..{self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"bound: a log scale needs low > 0, got {self.low}")


def _regime_bounds() -> dict[str, Bound]:
    terms = ("fair_share", "energy", "deadline", "priority")
    return {f"weights_{r}.{t}": Bound(0.0, 1.0) for r in REGIMES for t in terms}


BOUNDS: dict[str, Bound] = {
    # --- priority: the regime thresholds and the score's terms ---
    "low_load": Bound(0.2, 0.6),  # below high_load's range: the pair is always ordered
    "high_load": Bound(0.6, 0.95),
    **_regime_bounds(),
    "aging_per_h": Bound(0.005, 0.2, log=True),
    "urgency_scale_s": Bound(600.0, 6 * H, log=True),
    "urgency_missed": Bound(0.0, 2.0),
    "w_short": Bound(0.0, 20.0),  # 0: runtime-blind order (before issue 15's fix)
    "short_scale_s": Bound(600.0, 24 * H, log=True),
    "w_urgent": Bound(0.0, 5.0),  # 0: a deadline counts only inside p x (...)
    # --- placement score ---
    "w_speed": Bound(0.1, 10.0, log=True),
    "speed_runtime_scale_s": Bound(1 * H, 24 * H, log=True),
    "slow_guard_runtime_s": Bound(600.0, 24 * H, log=True),
    "slow_guard_min_speed": Bound(0.3, 1.0),
    "w_energy": Bound(0.1, 10.0, log=True),
    "green_speed_relief": Bound(0.0, 1.0),
    "energy_guard_factor": Bound(1.0, 100.0, log=True),
    "green_worth": Bound(0.0, 1.0),
    "green_min_tolerance": Bound(0.0, 1.0),
    "green_max_runtime_s": Bound(1 * H, 365 * DAY, log=True),
    "green_min_gpus": Bound(0.0, 16.0),  # 0: every tolerant job is green (before issue 15)
    "green_energy_slack": Bound(1.0, 3.0),
    "green_wait_s": Bound(60.0, 4 * H, log=True),
    "w_pack": Bound(0.0, 2.0),
    "w_thermal": Bound(0.0, 1.0),
    "w_memory_fit": Bound(0.0, 1.0),
    # --- power saving ---
    "suspend_after_s": Bound(60.0, 1 * H, log=True),
    "warm_reserve_frac": Bound(0.0, 0.1),
    "warm_history_s": Bound(600.0, 24 * H, log=True),
    "warm_quantile": Bound(0.5, 1.0),
    "warm_min_nodes": Bound(0, 2),
    "warm_high_hold_gpus": Bound(0.0, 64.0),
    # --- priority protection (moving running jobs) ---
    "preempt.protect_priority": Bound(5, 9),
    "preempt.priority_gap": Bound(1, 5),
    "preempt.min_wait_s": Bound(60.0, 2 * H, log=True),
    "preempt.lost_per_wait": Bound(0.1, 10.0, log=True),
    "preempt.at_risk_share": Bound(0.0, 0.5),
    "preempt.lost_work_cap_s": Bound(300.0, 2 * H, log=True),
    "preempt.min_interval_s": Bound(600.0, 4 * H, log=True),
    "preempt.min_run_s": Bound(60.0, 1800.0, log=True),
    "preempt.max_per_pass": Bound(1, 16),
    "preempt.grow_quiet_s": Bound(600.0, 4 * H, log=True),
    "preempt.short_max_s": Bound(600.0, 4 * H, log=True),
    "preempt.short_wait_factor": Bound(0.5, 8.0, log=True),
    "preempt.short_victim_factor": Bound(1.5, 16.0, log=True),
}

_PHYSICAL = "a fact of the hardware or the jobs, not a choice: the replay takes it as given"
_COST = (
    "trades replay/pass cost for decision quality; the objective has no cost term, so a search "
    "would drive it to its most expensive end"
)
_NO_HEAT = "acts on hot nodes only; the calibration traces carry no heat scenario (no signal)"
_PROMISE = "a promise to users that the objective does not price; changing it breaks the promise"
_OFF = "acts only while its switch is on, off by default (calibrate with the switch set)"
_SWITCH = "a switch (bool), not a coefficient: which rules run is an operator's choice"
_TABLE = "a table describing the workload, not a coefficient"
_OUTPUT = "what is reported, not what is decided"

EXCLUDED: dict[str, str] = {
    "green_energy_scales": _SWITCH,
    "backfill": _SWITCH,
    "power_saving": _SWITCH,
    "warm_reserve": _SWITCH,
    "warm_high_headroom": _SWITCH,
    "guard_holds_high": _SWITCH + " (a promise to high-priority jobs: start when room exists)",
    "preempt.enabled": _SWITCH,
    "preempt.resume_counts_ends": _SWITCH,
    "preempt.burst_enabled": _SWITCH,
    "preempt.grow_enabled": _SWITCH,
    "preempt.short_enabled": _SWITCH,
    "preempt.boot_enabled": _SWITCH,
    "service_rank_boost": _PROMISE + " (a latency target first in line)",
    "defrag.enabled": _SWITCH,
    "thermal.enabled": _SWITCH,
    "size_mix": _TABLE,
    "frag_workload": _TABLE,
    "resume_s": _PHYSICAL,
    "thermal_max_c": _PHYSICAL + " (the GPUs' safe limit)",
    "thermal_ambient_c": _PHYSICAL,
    "preempt.checkpoint_cost_s": _PHYSICAL,
    "defrag.checkpoint_cost_s": _PHYSICAL,
    "defrag.checkpoint_interval_s": _PHYSICAL + " (how often jobs save)",
    "thermal.threshold_c": _NO_HEAT,
    "thermal.clear_c": _NO_HEAT,
    "thermal.window": _NO_HEAT,
    "thermal.max_moves_per_window": _NO_HEAT,
    "thermal.hold_ttl_windows": _NO_HEAT,
    "thermal.hold_ttl_min_s": _NO_HEAT,
    "thermal.risk_clear_busy_s": _NO_HEAT,
    "thermal.averse_wait_share": _NO_HEAT,
    "thermal.averse_min_gpus": _NO_HEAT,
    "thermal.averse_runtime_s": _NO_HEAT,
    "thermal.risky_heat": _NO_HEAT + " (nor heat labels)",
    "thermal.sim_sample_s": "the simulator's telemetry cadence, not a policy choice",
    "reservations": _COST,
    "backfill_depth": _COST,
    "backfill_interval_s": _COST,
    "rerank_interval_s": _COST,
    "power_demand_cap": _COST,
    "max_places_per_pass": _COST,
    "preempt.interval_s": _COST,
    "preempt.candidate_nodes": _COST,
    "defrag.candidate_nodes": _COST,
    "preempt.resume_bound_s": _PROMISE + " (a moved job restarts within it)",
    "preempt.resume_credit_s": _PROMISE + " (it keeps the resume bound the plan checked)",
    "defrag.max_moves": _OFF + " (defrag.enabled)",
    "preempt.boot_priority": _OFF + " (preempt.boot_enabled)",
    "preempt.boot_min_wait_s": _OFF + " (preempt.boot_enabled)",
    "preempt.boot_interval_s": _OFF + " (preempt.boot_enabled)",
    "w_frag": _OFF + " (a frag_workload; empty by default)",
    "explain_top_k": _OUTPUT,
    # day/night (issue 16): off by default, and the calibration traces carry no inference jobs
    "calendar.enabled": _SWITCH,
    "calendar.timezone": "where the cluster is, not a coefficient",
    "calendar.day.hours": "the operator's working hours, not a coefficient",
    "calendar.night.hours": "the operator's working hours, not a coefficient",
    "calendar.active": _OUTPUT,
    **{
        f"calendar.{period}.{name}": _OFF + " (calendar.enabled)"
        for period in ("day", "night")
        for name in ("inference_boost", "training_boost", "headroom_share", "speed_weight_factor")
    },
    "share_interference": _SWITCH,
    "share_max_slowdown": _PROMISE + " (how much slower a shared job may run)",
    "share_latency_unknown_max_slowdown": _PROMISE + " (a latency target's assumed headroom)",
}


def leaf_fields(cls: type = PolicyConfig, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted name, declared type) of every non-record field of the config, nested included."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            yield from leaf_fields(kind, prefix + f.name + ".")
        else:
            yield prefix + f.name, kind


def check_covers(cls: type = PolicyConfig) -> None:
    """Raise naming every field of config class ``cls`` that is neither bounded nor excluded
    (or both), and every bound whose field is gone, not a number, or misses the default."""
    kinds = dict(leaf_fields(cls))
    problems = [f"{k}: no bound and no exclusion" for k in kinds if k not in BOUNDS | EXCLUDED]
    problems += [f"{k}: both bounded and excluded" for k in BOUNDS.keys() & EXCLUDED.keys()]
    problems += [f"{k}: not a field of PolicyConfig" for k in BOUNDS.keys() - kinds.keys()]
    problems += [f"{k}: not a field of PolicyConfig" for k in EXCLUDED.keys() - kinds.keys()]
    defaults = _defaults(cls)
    for k, b in BOUNDS.items():
        if k not in kinds:
            continue
        if kinds[k] not in (int, float):
            problems.append(f"{k}: bounded but of type {kinds[k]} (a coefficient is a number)")
        elif not b.low <= defaults[k] <= b.high:
            problems.append(f"{k}: default {defaults[k]} outside {b.low}..{b.high}")
    if problems:
        raise ValueError("search space out of step with PolicyConfig: " + "; ".join(problems))


def _defaults(cls: type = PolicyConfig) -> dict[str, Any]:
    from libs.policy_io.policy_file import flat_values

    return flat_values(cls())


def kind_of(name: str) -> Any:
    """The declared type (int or float) of coefficient ``name``."""
    return dict(leaf_fields())[name]


def default_params() -> dict[str, float | int]:
    """The defaults as a point of the space (the study's first trial)."""
    d = _defaults()
    return {k: d[k] for k in BOUNDS}


def near_defaults(radius: float) -> dict[str, Bound]:
    """``BOUNDS`` cut to a region around the defaults: ``radius`` of each range on each side
    (a log range by that share of its decades), within the range; 1 (or more): the whole space.

    Why: with tens of trials in 50 dimensions, a search over whole ranges finds points that fit
    the train part by moves no hold-out supports (the first calibrations: speed weight 0.11,
    deadline jobs on slow GPUs, 14.6 % of deadlines missed on the holdout against 0.9 % at the
    defaults). A region around the hand-set defaults keeps every coefficient within a factor
    of its measured value, so a calibration refines the defaults rather than replacing them.
    """
    if not radius > 0:
        raise ValueError(f"--radius must be > 0 (a share of each range), got {radius}")
    if radius >= 1.0:
        return dict(BOUNDS)
    d = _defaults()
    out: dict[str, Bound] = {}
    for name, b in BOUNDS.items():
        x = float(d[name])
        if b.log:
            f = (b.high / b.low) ** radius
            lo, hi = max(b.low, x / f), min(b.high, x * f)
        else:
            w = radius * (b.high - b.low)
            lo, hi = max(b.low, x - w), min(b.high, x + w)
        if kind_of(name) is int:
            lo, hi = float(math.floor(lo)), float(math.ceil(hi))  # whole numbers, outward
            if lo == hi:
                lo, hi = (lo, lo + 1) if lo + 1 <= b.high else (lo - 1, lo)
        out[name] = Bound(lo, hi, b.log)
    return out


def to_values(params: Mapping[str, float | int]) -> dict[str, float | int]:
    """A point of the space as config values: each regime's four weights scaled to sum 1
    (all zero: equal weights), every other coefficient as sampled."""
    out = dict(params)
    for r in REGIMES:
        keys = [k for k in BOUNDS if k.startswith(f"weights_{r}.")]
        total = sum(float(out[k]) for k in keys)
        if abs(total - 1.0) <= 1e-9:
            continue  # already a share (the defaults): keep the values exact
        for k in keys:
            out[k] = float(out[k]) / total if total > 0 else 1.0 / len(keys)
    return out
