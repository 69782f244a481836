"""The day/night policy (issue 16): the config in force at a time, and what its period changes.

``effective_policy(cfg, time_s)`` is the one definition both drivers use: the scheduler
(``libs.policy.core.Scheduler``, fed by the simulator and by the live placer) calls it at each
pass's ``now`` through ``DayNight``, and ``mosaic policy`` prints it. A period changes:

* rank: ``kind_boost`` adds the period's ``inference_boost`` / ``training_boost`` to a queued
  job's score (``priority.score_arrays``, ``score_queue_rows``);
* filter: ``headroom_gpus`` GPUs are kept free for inference jobs; a training job does not
  start where it would leave fewer whole free GPUs on available nodes (``step.Pass``, reason
  ``Headroom``);
* placement: ``w_speed`` times the period's ``speed_weight_factor``;
* power: ``warm_reserve_frac`` at least the headroom share, so the kept GPUs stay awake.

With the calendar off (the default) the config is returned unchanged, so nothing moves.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from libs.policy.calendar import next_switch_s, period_at
from libs.policy.config import PolicyConfig

HEADROOM = "Headroom"  # the wait reason of a training job the headroom holds off


def effective_policy(cfg: PolicyConfig, time_s: float) -> tuple[PolicyConfig, str]:
    """(the config in force at ``time_s``, its period's name: "day", "night", or "" with the
    calendar off). Pure: the same config and time give an equal config."""
    cal = cfg.calendar
    if not cal.enabled:
        return cfg, ""
    name = period_at(cal, time_s)
    return _apply(cfg, name), name


def in_force(eff: PolicyConfig, regime: str | None = None) -> dict[str, float]:
    """What a period sets in ``eff`` (a config ``effective_policy`` gave), by name: the kind
    boosts, the headroom share, the speed weight, the warm reserve, and with ``regime`` that
    load regime's rank weights (``w_fair_share``, ...). One record for the live placer's wait
    decisions (``WaitNumbers.policy``, what ``mosaic explain`` shows) and ``mosaic policy``, so
    an operator reads the same names and values in both."""
    shift = eff.calendar.shift()
    out = {
        "inference_boost": shift.inference_boost,
        "training_boost": shift.training_boost,
        "headroom_share": shift.headroom_share,
        "w_speed": eff.w_speed,
        "warm_reserve_frac": eff.warm_reserve_frac,
    }
    if regime is not None:
        out.update({f"w_{k}": v for k, v in eff.weights(regime).as_dict().items()})
    return out


def _apply(cfg: PolicyConfig, name: str) -> PolicyConfig:
    cal = dataclasses.replace(cfg.calendar, active=name)
    p = cal.shift()
    return dataclasses.replace(
        cfg,
        calendar=cal,
        w_speed=cfg.w_speed * p.speed_weight_factor,
        warm_reserve_frac=max(cfg.warm_reserve_frac, p.headroom_share),
    )


def kind_boost(inference: np.ndarray, cfg: PolicyConfig) -> np.ndarray | None:
    """float per row: the score the active period adds to each job (``inference``: the queue's
    column, 1.0 for an inference job, 0.0 for a training one); None when it adds nothing."""
    p = cfg.calendar.shift()
    if p.inference_boost == 0.0 and p.training_boost == 0.0:
        return None
    return np.where(inference > 0.5, p.inference_boost, p.training_boost)


def headroom_gpus(total_gpus: float, cfg: PolicyConfig) -> int:
    """Whole GPUs a pass keeps free for inference jobs: the active period's share of the
    cluster's GPUs, rounded up (0: no headroom)."""
    share = cfg.calendar.shift().headroom_share
    return math.ceil(share * total_gpus - 1e-9) if share > 0 else 0


def holds_off(kind: str, gpus: float, free_gpus: int, headroom: int) -> bool:
    """A job of ``kind`` asking ``gpus`` waits for the headroom: it is not an inference job and
    starting it would leave fewer than ``headroom`` whole free GPUs (a fraction counts as the
    whole GPU it takes out of the free ones)."""
    if headroom <= 0 or kind == "inference":
        return False
    return free_gpus - math.ceil(gpus - 1e-9) < headroom


class DayNight:
    """``effective_policy`` for one scheduler: the config of each period built once, so a pass
    in the same period gets the same object (the rank epoch and the memos key on it by
    identity) and the first pass of a new period re-ranks the queue."""

    __slots__ = ("_built", "base")

    def __init__(self, base: PolicyConfig) -> None:
        self.base = base
        self._built: dict[str, PolicyConfig] = {"": base}

    def at(self, time_s: float) -> tuple[PolicyConfig, str]:
        """(config in force at ``time_s``, period name)."""
        cal = self.base.calendar
        if not cal.enabled:
            return self.base, ""
        name = period_at(cal, time_s)
        cfg = self._built.get(name)
        if cfg is None:
            cfg = self._built[name] = _apply(self.base, name)
        return cfg, name

    def next_switch_s(self, time_s: float) -> float | None:
        """When the period next changes (None with the calendar off): a driver passes then,
        so a job the headroom held starts at the switch without waiting for an event."""
        cal = self.base.calendar
        return next_switch_s(cal, time_s) if cal.enabled else None
