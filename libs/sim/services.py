"""Inference services for the simulator (issue 16): the scenario file and its load curves.

A scenario file (``mosaic sim --services FILE.json``) is a JSON object::

    {"services": [{"service": {...InferenceService...},
                   "load": "diurnal:peak=900,base=200,bursts=4,seed=1"}]}

``load`` is either a list of ``[time_s, rps]`` points (the rate holds from each point to the
next; the curve ends ``step_s`` after the last point) or a generator ``diurnal:KEY=VALUE,...``
(``diurnal``). Times are on the replay's clock (the trace's, from 0). A service is defined at
the first point and removed at the end of its curve (its replicas stop then).

The diurnal generator: a day's cosine between ``base`` and ``peak`` req/s peaking at
``peak_h`` o'clock, times a lognormal noise of sigma ``noise`` per point, with ``bursts``
bursts a day, each multiplying the rate by ``burst_x`` for ``burst_min`` minutes, starts drawn
uniformly (seeded by ``seed``). The shape is the usual one of interactive traffic (one daily
peak, a night trough at a quarter to a third of it); the figures are the experiment's, no
public trace is replayed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from libs.policy.stages.scale import replicas_for
from proto.inference import InferenceService, validate_service

DAY_S = 86_400.0
DIURNAL_DEFAULTS: dict[str, float] = {
    "peak": 800.0,  # req/s at the daily peak
    "base": 200.0,  # req/s at the night trough
    "peak_h": 14.0,  # the hour of the peak
    "bursts": 4.0,  # bursts per day
    "burst_x": 2.0,  # a burst multiplies the rate by this
    "burst_min": 15.0,  # ... for this many minutes
    "noise": 0.05,  # lognormal sigma per point
    "hours": 24.0,  # the curve's length
    "step_s": 60.0,  # one point per this many seconds (a minute: the latency model's unit)
    "seed": 0.0,
}


@dataclass(frozen=True, slots=True)
class ServiceLoad:
    """One service and its load curve: ``times_s[k]``, ``rps[k]`` hold until ``times_s[k+1]``
    (the last one until ``end_s``)."""

    service: InferenceService
    times_s: tuple[float, ...]
    rps: tuple[float, ...]
    end_s: float

    @property
    def peak_rps(self) -> float:
        return max(self.rps, default=0.0)

    def peak_replicas(self) -> int:
        """Replicas the peak needs at the scale-up threshold (what a pool sized for peak
        holds), within the service's range."""
        svc = self.service
        return replicas_for(svc, self.peak_rps, svc.scale_up_at)


def diurnal(text: str) -> tuple[list[float], list[float], float]:
    """``diurnal:KEY=VALUE,...`` (module docstring) as (times, rates, end)."""
    body = text.split(":", 1)[1] if ":" in text else ""
    p = dict(DIURNAL_DEFAULTS)
    for item in filter(None, (s.strip() for s in body.split(","))):
        key, _, value = item.partition("=")
        if key not in p:
            raise ValueError(f"diurnal: unknown key {key!r} (known: {', '.join(p)})")
        p[key] = float(value)
    if not (0 <= p["base"] <= p["peak"] and p["step_s"] > 0 and p["hours"] > 0):
        raise ValueError("diurnal: needs 0 <= base <= peak, step_s > 0, hours > 0")
    rng = np.random.default_rng(int(p["seed"]))
    t = np.arange(0.0, p["hours"] * 3600.0, p["step_s"])
    phase = 2 * math.pi * ((t / 3600.0 - p["peak_h"]) / 24.0)
    rate = p["base"] + (p["peak"] - p["base"]) * (1 + np.cos(phase)) / 2
    rate *= np.exp(rng.normal(0.0, p["noise"], len(t)))
    n_bursts = round(p["bursts"] * p["hours"] / 24.0)
    for start in rng.uniform(0.0, t[-1], n_bursts) if len(t) else ():
        rate[(t >= start) & (t < start + 60.0 * p["burst_min"])] *= p["burst_x"]
    return t.tolist(), rate.tolist(), float(p["hours"] * 3600.0)


def curve(load: Any, step_s: float = 60.0) -> tuple[list[float], list[float], float]:
    """A ``load`` entry (points or a generator string) as (times, rates, end)."""
    if isinstance(load, str):
        if not load.startswith("diurnal"):
            raise ValueError(f"unknown load generator {load!r} (known: diurnal:...)")
        return diurnal(load)
    pts = sorted((float(t), float(r)) for t, r in load)
    if not pts or any(r < 0 or not math.isfinite(r) for _, r in pts):
        raise ValueError("load points: a non-empty list of [time_s, rps >= 0]")
    return [t for t, _ in pts], [r for _, r in pts], pts[-1][0] + step_s


def parse_scenario(data: dict) -> list[ServiceLoad]:
    """A scenario object (module docstring) as its services, each validated."""
    out = []
    for entry in data.get("services", []):
        svc = msgspec.convert(entry["service"], InferenceService)
        errs = validate_service(svc)
        if errs:
            raise ValueError(
                f"service {svc.id}: " + "; ".join(f"{e.field}: {e.reason}" for e in errs)
            )
        times, rates, end = curve(entry["load"])
        out.append(ServiceLoad(svc, tuple(times), tuple(rates), end))
    if len({s.service.id for s in out}) != len(out):
        raise ValueError("two services of the scenario share an id")
    return out


def load_scenario(path: Path) -> list[ServiceLoad]:
    return parse_scenario(json.loads(Path(path).read_text()))
