"""How hot a GPU gets: a first-order thermal model, the same for the simulated telemetry backend
and the simulator (issue 14).

Why first-order: a GPU's die and heatsink behave, to the resolution a scheduler cares about
(seconds to minutes), like one thermal mass behind one thermal resistance. Under a constant
power ``P`` the temperature relaxes exponentially toward a steady state

    steady_c = ambient_c + c_per_w x P x heat

with a time constant ``tau_s``; with no load the steady state is close to ambient, so the same
equation cools an idle GPU. The exact solution over a step ``dt_s`` is

    T(t + dt) = steady + (T(t) - steady) x exp(-dt / tau)

so one step of 5 s (live telemetry) and one of 17 minutes (the gap between two simulator
events) are both exact for a constant power over the step, and never overshoot.

``c_per_w`` is per GPU: a GPU is cooled so that it settles at ``full_load_c`` at its board
power (``max_power_w``) with an ordinary heat profile, i.e. ``(full_load_c - ambient_c) /
max_power_w``. A T4 at 70 W and an A100 at 400 W thus both settle near 78 C, as they do in a
well-cooled rack. ``heat`` is the node's heat profile (``heat_factor``): 1 for an ordinary
node, 1.4 for one in a rack with poor airflow (its temperature rise above ambient is 40%
larger at the same power). A node carries it as the label ``mosaic/heat``.

Throttling (``THROTTLE_SPEED``): NVML documents its hardware slowdown as "reducing the core
clocks by a factor of 2 or more" (NVML API reference, ``nvmlClocksThrottleReasonHwSlowdown``),
so a GPU at or above its slowdown temperature runs at most half speed; the model takes exactly
one half. The slowdown temperature is per device (NVML's
``NVML_TEMPERATURE_THRESHOLD_SLOWDOWN``); ``ThermalModel.slowdown_c`` is the simulator's
figure for every GPU.

Pure: numbers in, numbers out; no I/O, no clock, no module state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from proto.nodes import NodeSpec

HEAT_LABEL = "mosaic/heat"  # a node's heat profile, e.g. "1.4" (see heat_factor)
HEAT_MIN, HEAT_MAX = 0.1, 5.0
THROTTLE_SPEED = 0.5  # speed of a GPU in hardware slowdown (NVML: clocks / 2 or more)
UTIL_PER_SHARE = 0.9  # utilization of a GPU share a job holds (the sim backend's mean)


def gpu_power_w(idle_w: ArrayLike, max_w: ArrayLike, util: ArrayLike) -> np.ndarray:
    """A GPU's draw at ``util`` (0..1): idle plus the dynamic range times utilization."""
    idle = np.asarray(idle_w, dtype=float)
    return idle + (np.asarray(max_w, dtype=float) - idle) * np.asarray(util, dtype=float)


@dataclass(frozen=True, slots=True)
class ThermalModel:
    """The model's constants. Defaults: a data-centre rack at 30 C inlet (ASHRAE's allowable
    A1 class tops out at 32 C), GPUs settling at 78 C at board power, a time constant of 30 s
    (a GPU heatsink reaches most of its steady state within a couple of minutes)."""

    ambient_c: float = 30.0
    full_load_c: float = 78.0
    tau_s: float = 30.0
    slowdown_c: float = 90.0  # hardware slowdown from here (the simulator's throttle)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.tau_s) and self.tau_s > 0):
            raise ValueError(f"tau_s must be > 0, got {self.tau_s}")
        if not self.full_load_c > self.ambient_c:
            raise ValueError("full_load_c must be above ambient_c")
        if not self.slowdown_c > self.ambient_c:
            raise ValueError("slowdown_c must be above ambient_c")

    def c_per_w(self, max_power_w: ArrayLike) -> np.ndarray:
        """Degrees of rise per watt for GPUs of this board power (0 W: no rise)."""
        m = np.asarray(max_power_w, dtype=float)
        rise = self.full_load_c - self.ambient_c
        return np.where(m > 0, rise / np.where(m > 0, m, 1.0), 0.0)

    def steady_c(self, power_w: ArrayLike, max_power_w: ArrayLike, heat: ArrayLike = 1.0):
        """The temperature a GPU settles at under a constant ``power_w``. Every argument may be
        an array (they broadcast: the simulator passes nodes x GPUs at once)."""
        return self.ambient_c + self.c_per_w(max_power_w) * np.asarray(power_w) * heat

    def step(
        self,
        temp_c: ArrayLike,
        power_w: ArrayLike,
        dt_s: float,
        *,
        max_power_w: ArrayLike,
        heat: ArrayLike = 1.0,
    ) -> np.ndarray:
        """Temperatures after ``dt_s`` seconds at a constant ``power_w`` (a new array)."""
        steady = self.steady_c(power_w, max_power_w, heat)
        keep = math.exp(-max(0.0, dt_s) / self.tau_s)
        return steady + (np.asarray(temp_c, dtype=float) - steady) * keep

    def throttled(self, temp_c: np.ndarray) -> np.ndarray:
        """Which GPUs are in hardware slowdown (run at ``THROTTLE_SPEED``)."""
        return np.asarray(temp_c) >= self.slowdown_c


def heat_factor(node: NodeSpec, override: float | None = None) -> float:
    """A node's heat profile: ``override`` when given (the simulator's hot nodes), else its
    ``mosaic/heat`` label, else 1. A label that is not a number in [0.1, 5] is an error naming
    the node and the label: a typo must not silently make a hot rack look ordinary."""
    if override is not None:
        return _checked(override, f"heat factor of {node.id}")
    text = node.labels.get(HEAT_LABEL)
    if text is None:
        return 1.0
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"node {node.id}: label {HEAT_LABEL}={text!r} is not a number") from None
    return _checked(value, f"node {node.id}: label {HEAT_LABEL}")


def _checked(value: float, what: str) -> float:
    if not (math.isfinite(value) and HEAT_MIN <= value <= HEAT_MAX):
        raise ValueError(f"{what} must be in [{HEAT_MIN}, {HEAT_MAX}], got {value}")
    return float(value)
