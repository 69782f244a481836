"""Learning speed and power per (GPU model, workload class, framework) from finished jobs.

The rule, one definition for both drivers (the simulator's Mosaic adapter and the live
profiler service):

1. **Observation.** A job that completed on one GPU model ran ``work_fraction`` of its work
   (1 minus the progress it resumed from) in ``runtime_s``; its spec says the whole job takes
   ``est_runtime_s`` on the reference GPU. Its observed speed is
   ``est_runtime_s * work_fraction / runtime_s`` (``observed_speed``); its power per GPU is
   what its energy says over its GPU-seconds.
2. **Seeding, with a minimum count.** The first ``min_samples`` observations of a key are only
   collected; the entry counts (the scheduler uses it) once there are that many, starting from
   their *median*: one wild sample among three cannot set the estimate, and the prior table
   (perhaps wrong, which is why we learn) does not anchor it.
3. **Smoothing, bounded.** Each later observation moves the estimate by an EWMA of weight
   ``alpha``, after being clipped to within ``outlier_factor`` of the current estimate; so one
   outlier moves an entry by at most ``alpha * (outlier_factor - 1)`` (30% with the defaults)
   and never by orders of magnitude, while a real change (a driver upgrade, a new model
   measured wrongly) is followed within a handful of jobs.

Why (model, class, framework) and a pooled row: jobs of one class on one model differ by
framework (PyTorch vs TensorFlow kernels), so the learner keeps a row per framework for
``mosaic profiles``; the scheduler's table is per (model, class), so it takes the pooled row
(``POOLED``, every framework's observations together). Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from libs.policy.profiles import ProfileEntry, ProfileTable
from proto.gpus import canonical_model

POOLED = "*"  # the framework of the row pooling every framework (what the scheduler uses)
LEARNT_PREFIX = "learnt"

Key = tuple[str, str, str]  # (GPU model, workload class, framework)


@dataclass(frozen=True, slots=True)
class LearningConfig:
    """The rule's knobs (see the module docstring)."""

    alpha: float = 0.3  # EWMA weight of a new observation once the entry counts
    min_samples: int = 3  # observations before an entry counts (its median seeds it)
    outlier_factor: float = 2.0  # an observation is clipped to [est / f, est * f]

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        if self.min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {self.min_samples}")
        if not self.outlier_factor > 1.0:
            raise ValueError(f"outlier_factor must be > 1, got {self.outlier_factor}")

    def max_step(self) -> float:
        """The largest relative change one observation can make to a counted entry."""
        return self.alpha * (self.outlier_factor - 1.0)


@dataclass(frozen=True, slots=True)
class Learnt:
    """One key's estimate. ``seed``: the (speed, power_w) observations collected before the
    entry counts (emptied once it does)."""

    speed: float
    power_w: float
    samples: int
    seed: tuple[tuple[float, float], ...] = ()

    def counts(self, cfg: LearningConfig) -> bool:
        return self.samples >= cfg.min_samples


def observed_speed(est_runtime_s: float, work_fraction: float, runtime_s: float) -> float | None:
    """Speed relative to the reference GPU, or None when the figures say nothing (a zero or
    non-finite runtime, no work done)."""
    figures = (est_runtime_s, work_fraction, runtime_s)
    if not all(math.isfinite(x) and x > 0 for x in figures):
        return None
    return est_runtime_s * min(work_fraction, 1.0) / runtime_s


def observed_power_w(energy_kwh: float, gpus: float, runtime_s: float) -> float | None:
    """Mean power per GPU over the attempt, or None when the figures say nothing."""
    if not all(math.isfinite(x) and x > 0 for x in (energy_kwh, gpus, runtime_s)):
        return None
    return energy_kwh * 3.6e6 / (gpus * runtime_s)


def _clip(x: float, around: float, factor: float) -> float:
    return min(max(x, around / factor), around * factor)


def learn(prior: Learnt | None, speed: float, power_w: float | None, cfg: LearningConfig) -> Learnt:
    """The key's estimate after one more observation (``power_w`` None: speed only)."""
    if not (math.isfinite(speed) and speed > 0):
        raise ValueError(f"learn: speed must be a positive number, got {speed}")
    if power_w is not None and not (math.isfinite(power_w) and power_w > 0):
        power_w = None
    if prior is None or not prior.counts(cfg):
        seed = (prior.seed if prior is not None else ()) + ((speed, power_w or math.nan),)
        n = len(seed)
        s = statistics.median(x for x, _ in seed)
        powers = [p for _, p in seed if not math.isnan(p)]
        p = statistics.median(powers) if powers else math.nan
        if n >= cfg.min_samples:
            return Learnt(s, p, n)
        return Learnt(s, p, n, seed)
    f, a = cfg.outlier_factor, cfg.alpha
    new_speed = prior.speed + a * (_clip(speed, prior.speed, f) - prior.speed)
    new_power = prior.power_w
    if power_w is not None:
        if math.isnan(prior.power_w):
            new_power = power_w
        else:
            new_power = prior.power_w + a * (_clip(power_w, prior.power_w, f) - prior.power_w)
    return Learnt(new_speed, new_power, prior.samples + 1)


class ProfileLearner:
    """The learnt estimates over a base table; ``table()`` is what the scheduler should use.

    Stateful, no I/O: the profiler service and the simulator's Mosaic adapter each hold one
    and feed it ``observe``; ``restore`` rebuilds it from published records.
    """

    def __init__(self, base: ProfileTable, cfg: LearningConfig | None = None) -> None:
        self.base = base
        self.cfg = cfg or LearningConfig()
        self.learnt: dict[Key, Learnt] = {}
        self._table: ProfileTable | None = base

    def observe(
        self,
        model: str,
        workload_class: str,
        framework: str,
        speed: float,
        power_w: float | None = None,
    ) -> bool:
        """Fold one observation into its framework's row and the pooled row. True when the
        scheduler's table changed (the pooled row counts now)."""
        m = canonical_model(model)
        changed = False
        for fw in {framework or POOLED, POOLED}:
            key = (m, workload_class, fw)
            new = learn(self.learnt.get(key), speed, power_w, self.cfg)
            self.learnt[key] = new
            changed |= fw == POOLED and new.counts(self.cfg)
        if changed:
            self._table = None
        return changed

    def restore(self, rows: Iterable[tuple[Key, Learnt]]) -> None:
        """Start again from published rows (a restarted profiler, a scheduler's first read)."""
        self.learnt = {(canonical_model(k[0]), k[1], k[2]): v for k, v in rows}
        self._table = None

    def table(self) -> ProfileTable:
        """The base table with every counted pooled row in place of its entry (memoised)."""
        if self._table is None:
            self._table = apply_learnt(self.base, self.learnt, self.cfg)
        return self._table


def apply_learnt(
    base: ProfileTable, learnt: Mapping[Key, Learnt], cfg: LearningConfig
) -> ProfileTable:
    """``base`` with each counted pooled row's speed (and power, where one was observed) in
    place of its entry; the source says it was learnt, from how many jobs, over what."""
    entries = dict(base.entries)
    for (model, cls, fw), row in learnt.items():
        if fw != POOLED or not row.counts(cfg):
            continue
        old = base.entry(model, cls)
        power = old.power_w if math.isnan(row.power_w) else row.power_w
        was = "estimated" if old.estimated else "measured"
        src = f"{LEARNT_PREFIX}: {row.samples} jobs (over {was}: {old.source})"
        entries[(model, cls)] = ProfileEntry(row.speed, power, src, False)
    return ProfileTable(MappingProxyType(entries), base.idle_w, base.reference_model)


def source_kind(entry: ProfileEntry) -> str:
    """measured | learnt | estimated: where a table entry came from, for ``mosaic profiles``."""
    if entry.source.startswith(LEARNT_PREFIX):
        return "learnt"
    return "estimated" if entry.estimated else "measured"
