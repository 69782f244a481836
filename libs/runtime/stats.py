"""Step times and throughput, as the job's own clock sees them."""

from __future__ import annotations

import time
from collections import deque

WINDOW_STEPS = 32  # throughput is over the last this many steps: recent, yet not one step's noise


class StepStats:
    """``step(samples)`` at the end of each step; the time of a step is the wall time since
    the previous call (the first: since ``start``)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.steps = 0
        self.samples = 0
        self.step_time_s: float | None = None
        self.step_time_sum_s = 0.0
        self._last = self.started
        self._window: deque[tuple[float, int]] = deque(maxlen=WINDOW_STEPS)

    def step(self, samples: int = 0) -> float:
        """Count one step of ``samples`` samples; returns its duration in seconds."""
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
            raise ValueError(f"samples: must be a whole number >= 0, got {samples!r}")
        now = time.monotonic()
        took_s = now - self._last
        self._last = now
        self.steps += 1
        self.samples += samples
        self.step_time_s = took_s
        self.step_time_sum_s += took_s
        self._window.append((took_s, samples))
        return took_s

    def steps_per_s(self) -> float | None:
        spent_s = sum(t for t, _ in self._window)
        return len(self._window) / spent_s if self._window and spent_s > 0 else None

    def samples_per_s(self) -> float | None:
        spent_s = sum(t for t, _ in self._window)
        return sum(n for _, n in self._window) / spent_s if self._window and spent_s > 0 else None
