"""The objective of ``mosaic calibrate``: what "better" means, written down (lower is better).

    score = sum_t w_t * value_t / best_peer_t / sum_t w_t  +  starvation_weight * max(0,
            starvation_max_wait_s / bound_s - 1)

Each term ``t`` is a metric of ``libs.sim.metrics`` (lower is better; deadline attainment enters
as its miss share) divided by the best value any baseline (fifo, drf, tiresias, gavel) reached on
the same part of the trace: a term of 1.0 ties the best peer on that metric, and terms measured
in seconds, kWh and shares add up on one scale (Kubernetes' NormalizeScore, for the same
reason). A small floor per term keeps a peer's near-zero value (no high-priority wait at all)
from turning a few seconds into a huge ratio.

The starvation penalty is zero until the lowest priority class's longest wait passes the bound,
then grows linearly: aging guarantees every job runs, and this keeps a search from buying the
other terms with one class's unbounded wait. The bound is ``starvation_bound_s`` seconds, or
else ``starvation_bound_x`` times the best peer's, and never above ``starvation_vs_default``
times the default config's own (when the default's run is given; 0: no such cap), at least
``STARVATION_FLOOR_S``. Why the default's own: every peer starves a loaded part too (on Philly's
first 4,200 jobs at 0.9 the best peer's longest wait was 12 days), so a bound of twice the
best peer let the first shipped calibration lower the aging fivefold on the train part and
starve the lowest class on traces it had not seen; a calibration may not starve longer than the
hand-set defaults do without paying for it.

Energy is each run's own ``energy_kwh``, over the window the simulator states in
``results.json`` (the trace's makespan bound, or the run's own end if later,
``libs.sim.metrics.ENERGY_WINDOW_RULE``): it does not move with the other runs' makespans, as
issue 15 asks of every figure. The replays give every policy the same node power saving
(``Setup.power_saving``, "all" by default), so the energy term compares decisions, not who may
switch nodes off. A term neither side measured (a part with no deadline jobs) is left out of
both sums; a term the peers measured and the run did not counts ``MISSING_RATIO``.

``--objective`` takes JSON (``{"jct_mean_s": 2, "starvation_weight": 0}``) or ``k=v,k=v``;
unknown keys are an error naming the key. The definition is recorded in ``report.json``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

MISSING_RATIO = 10.0
STARVATION_FLOOR_S = 3600.0  # a relative bound is at least this: a wait under 1 h is no starvation


@dataclass(frozen=True, slots=True)
class Term:
    """How a term reads its value (lower is better) from a run's metrics, and its floor."""

    metric: str
    floor: float
    miss_share: bool = False  # the metric is a share met; the term is 1 - it

    def value(self, m: Mapping[str, Any]) -> float:
        v = m.get(self.metric)
        if v is None or not math.isfinite(float(v)):
            return math.nan
        return 1.0 - float(v) if self.miss_share else float(v)


TERMS: dict[str, Term] = {
    "queue_delay_high_mean_s": Term("queue_delay_high_mean_s", floor=60.0),
    "jct_mean_s": Term("jct_mean_s", floor=60.0),
    "deadline_miss": Term("deadline_attainment", floor=0.01, miss_share=True),
    "energy_kwh": Term("energy_kwh", floor=1.0),
    "queue_delay_mean_s": Term("queue_delay_mean_s", floor=60.0),
    "jct_p99_s": Term("jct_p99_s", floor=60.0),
    "energy_cost_usd": Term("energy_cost_usd", floor=0.1),
    "ftf_slowdown_p99": Term("ftf_slowdown_p99", floor=1.0),
}

DEFAULT_WEIGHTS = {"queue_delay_high_mean_s": 1.0, "jct_mean_s": 1.0, "deadline_miss": 1.0}
DEFAULT_WEIGHTS["energy_kwh"] = 1.0


@dataclass(frozen=True, slots=True)
class Objective:
    """The weights of the terms and the starvation penalty (see the module docstring)."""

    weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    starvation_weight: float = 0.5
    starvation_bound_s: float | None = None
    starvation_bound_x: float = 2.0
    starvation_vs_default: float = 1.0

    def __post_init__(self) -> None:
        for k, w in self.weights.items():
            if k not in TERMS:
                raise ValueError(f"--objective: unknown term {k!r}; known: {sorted(TERMS)}")
            if not (math.isfinite(w) and w >= 0):
                raise ValueError(f"--objective {k}: weight must be a number >= 0, got {w}")
        if not any(w > 0 for w in self.weights.values()):
            raise ValueError("--objective: at least one term needs a weight > 0")
        if not (math.isfinite(self.starvation_weight) and self.starvation_weight >= 0):
            raise ValueError("--objective starvation_weight: must be a number >= 0")
        if self.starvation_bound_s is not None and not self.starvation_bound_s > 0:
            raise ValueError("--objective starvation_bound_s: must be > 0 seconds")
        if not self.starvation_bound_x > 0:
            raise ValueError("--objective starvation_bound_x: must be > 0")
        if not (math.isfinite(self.starvation_vs_default) and self.starvation_vs_default >= 0):
            raise ValueError("--objective starvation_vs_default: must be a number >= 0")

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["terms"] = {k: asdict(TERMS[k]) for k in self.weights}
        out["lower_is_better"] = True
        return out

    def score(
        self,
        run: Mapping[str, Any],
        peers: Mapping[str, Mapping[str, Any]],
        default: Mapping[str, Any] | None = None,
    ) -> tuple[float, dict[str, Any]]:
        """(score, its breakdown) of metrics ``run`` against the baselines' metrics ``peers``
        (``default``: the default config's metrics on the same part, which caps the starvation
        bound; None: no cap)."""
        if not peers:
            raise ValueError("objective: no peer runs to normalise by")
        total, wsum, terms = 0.0, 0.0, {}
        for k, w in self.weights.items():
            t = TERMS[k]
            best = min((t.value(p) for p in peers.values()), default=math.nan, key=_nan_last)
            mine = t.value(run)
            if math.isnan(best):
                terms[k] = {"value": _json(mine), "best_peer": None, "ratio": None}
                continue
            ratio = MISSING_RATIO if math.isnan(mine) else max(mine, t.floor) / max(best, t.floor)
            terms[k] = {"value": _json(mine), "best_peer": best, "ratio": ratio}
            total += w * ratio
            wsum += w
        base = total / wsum if wsum > 0 else 0.0
        penalty, bound = self._starvation(run, peers, default)
        wait = _json(run.get("starvation_max_wait_s"))
        terms["starvation"] = {"max_wait_s": wait, "bound_s": bound, "penalty": penalty}
        return base + penalty, terms

    def starvation_bound_s_of(
        self, peers: Mapping[str, Mapping[str, Any]], default: Mapping[str, Any] | None = None
    ) -> float | None:
        """The bound on the lowest class's longest wait (module docstring; None: no peer
        measured one and none is set)."""
        if self.starvation_bound_s is not None:
            return self.starvation_bound_s
        waits = [_f(p.get("starvation_max_wait_s")) for p in peers.values()]
        finite = [w for w in waits if not math.isnan(w)]
        if not finite:
            return None
        bound = self.starvation_bound_x * min(finite)
        own = math.nan if default is None else _f(default.get("starvation_max_wait_s"))
        if self.starvation_vs_default > 0 and not math.isnan(own):
            bound = min(bound, self.starvation_vs_default * own)
        return max(bound, STARVATION_FLOOR_S)

    def _starvation(
        self,
        run: Mapping[str, Any],
        peers: Mapping[str, Mapping[str, Any]],
        default: Mapping[str, Any] | None,
    ) -> tuple[float, float | None]:
        """(penalty, bound in seconds) of the lowest class's longest wait."""
        bound = self.starvation_bound_s_of(peers, default)
        wait = _f(run.get("starvation_max_wait_s"))
        if bound is None or math.isnan(wait) or self.starvation_weight == 0:
            return 0.0, bound
        return self.starvation_weight * max(0.0, wait / bound - 1.0), bound


def _f(v: Any) -> float:
    return math.nan if v is None else float(v)


def _json(v: Any) -> float | None:
    return None if v is None or not math.isfinite(float(v)) else float(v)


def _nan_last(v: float) -> float:
    return math.inf if math.isnan(v) else v


def objective_from_dict(d: Mapping[str, Any] | None) -> Objective:
    """The objective ``Objective.as_dict()`` wrote (in ``setup.json``, ``report.json``)."""
    if not d:
        return Objective()
    keys = (
        "weights",
        "starvation_weight",
        "starvation_bound_s",
        "starvation_bound_x",
        "starvation_vs_default",
    )
    return Objective(**{k: d[k] for k in keys if k in d})


def parse_objective(text: str | None) -> Objective:
    """``--objective``: JSON object or ``k=v,k=v``. Term names set weights (the terms not named
    keep none: naming terms replaces the default set); ``starvation_weight``,
    ``starvation_bound_s``, ``starvation_bound_x`` and ``starvation_vs_default`` set the
    penalty."""
    if text is None or not text.strip():
        return Objective()
    raw: dict[str, Any]
    t = text.strip()
    if t.startswith("{"):
        try:
            raw = json.loads(t)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--objective: not JSON ({exc.msg})") from None
        if not isinstance(raw, dict):
            raise ValueError("--objective: JSON must be an object of weights")
    else:
        raw = {}
        for pair in t.split(","):
            key, sep, val = pair.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"--objective wants KEY=VALUE pairs, got {pair!r}")
            raw[key.strip()] = val.strip()
    knobs = {f.name for f in fields(Objective)} - {"weights"}
    weights: dict[str, float] = {}
    kw: dict[str, Any] = {}
    for key, val in raw.items():
        try:
            num = float(val)
        except (TypeError, ValueError):
            raise ValueError(f"--objective {key}: {val!r} is not a number") from None
        if key in knobs:
            kw[key] = num
        elif key in TERMS:
            weights[key] = num
        else:
            known = sorted(TERMS) + sorted(knobs)
            raise ValueError(f"--objective: unknown key {key!r}; known: {known}")
    return Objective(weights=weights or dict(DEFAULT_WEIGHTS), **kw)
