"""The objective of ``mosaic calibrate``: what "better" means, written down (lower is better).

    score = sum_t w_t * value_t / best_peer_t / sum_t w_t  +  starvation_weight * max(0,
            starvation_max_wait_s / bound_s - 1)

Each term ``t`` is a metric of ``libs.sim.metrics`` (lower is better; deadline attainment enters
as its miss share) divided by the best value any baseline (fifo, drf, tiresias, gavel) reached on
the same part of the trace: a term of 1.0 ties the best peer on that metric, and terms measured
in seconds, kWh and shares add up on one scale (Kubernetes' NormalizeScore, for the same
reason). A small floor per term keeps a peer's near-zero value (no high-priority wait at all)
from turning a few seconds into a huge ratio. The starvation penalty is zero until the lowest
priority class's longest wait passes the bound (``starvation_bound_s`` seconds, or else
``starvation_bound_x`` times the best peer's, at least ``STARVATION_FLOOR_S``), then grows
linearly: aging guarantees every job
runs, and this keeps a search from buying the other terms with one class's unbounded wait.

Energy is compared over one window (``libs.sim.metrics.rewindow``): the longest makespan of the
run and the peers, so no run is rewarded for a short tail. A term neither side measured (a part
with no deadline jobs) is left out of both sums; a term the peers measured and the run did not
counts ``MISSING_RATIO``.

``--objective`` takes JSON (``{"jct_mean_s": 2, "starvation_weight": 0}``) or ``k=v,k=v``;
unknown keys are an error naming the key. The definition is recorded in ``report.json``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from libs.sim.metrics import rewindow

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

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["terms"] = {k: asdict(TERMS[k]) for k in self.weights}
        out["lower_is_better"] = True
        return out

    def score(
        self, run: Mapping[str, Any], peers: Mapping[str, Mapping[str, Any]]
    ) -> tuple[float, dict[str, Any]]:
        """(score, its breakdown) of metrics ``run`` against the baselines' metrics ``peers``."""
        if not peers:
            raise ValueError("objective: no peer runs to normalise by")
        window_s = max([run["makespan_s"], *(p["makespan_s"] for p in peers.values())])
        run_w = rewindow(own_window(run), window_s)
        peers_w = {n: rewindow(own_window(p), window_s) for n, p in peers.items()}
        total, wsum, terms = 0.0, 0.0, {}
        for k, w in self.weights.items():
            t = TERMS[k]
            best = min((t.value(p) for p in peers_w.values()), default=math.nan, key=_nan_last)
            mine = t.value(run_w)
            if math.isnan(best):
                terms[k] = {"value": _json(mine), "best_peer": None, "ratio": None}
                continue
            ratio = MISSING_RATIO if math.isnan(mine) else max(mine, t.floor) / max(best, t.floor)
            terms[k] = {"value": _json(mine), "best_peer": best, "ratio": ratio}
            total += w * ratio
            wsum += w
        base = total / wsum if wsum > 0 else 0.0
        penalty, bound = self._starvation(run_w, peers_w)
        wait = _json(run_w.get("starvation_max_wait_s"))
        terms["starvation"] = {"max_wait_s": wait, "bound_s": bound, "penalty": penalty}
        return base + penalty, terms

    def _starvation(
        self, run: Mapping[str, Any], peers: Mapping[str, Mapping[str, Any]]
    ) -> tuple[float, float | None]:
        """(penalty, bound in seconds) of the lowest class's longest wait."""
        bound = self.starvation_bound_s
        if bound is None:
            waits = [_f(p.get("starvation_max_wait_s")) for p in peers.values()]
            finite = [w for w in waits if not math.isnan(w)]
            if finite:
                bound = max(self.starvation_bound_x * min(finite), STARVATION_FLOOR_S)
        wait = _f(run.get("starvation_max_wait_s"))
        if bound is None or math.isnan(wait) or self.starvation_weight == 0:
            return 0.0, bound
        return self.starvation_weight * max(0.0, wait / bound - 1.0), bound


def own_window(m: Mapping[str, Any]) -> dict[str, Any]:
    """Metrics of a ``run_simulation`` result back on the run's own window: that result was
    rewindowed to its own call's policies (``energy_own_window_kwh`` keeps the own figure), and
    rewindowing it again to a longer window would count the first tail twice."""
    out = dict(m)
    own = m.get("energy_own_window_kwh")
    if own is not None:
        out["energy_kwh"] = own
        out["energy_idle_kwh"] = own - m["energy_active_kwh"]
    return out


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
    keys = ("weights", "starvation_weight", "starvation_bound_s", "starvation_bound_x")
    return Objective(**{k: d[k] for k in keys if k in d})


def parse_objective(text: str | None) -> Objective:
    """``--objective``: JSON object or ``k=v,k=v``. Term names set weights (the terms not named
    keep none: naming terms replaces the default set); ``starvation_weight``,
    ``starvation_bound_s`` and ``starvation_bound_x`` set the penalty."""
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
