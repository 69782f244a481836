"""When a driver must give the scheduler an instant of its own: the next backfill pass and the
next power check, kept exactly as the simulator's engine keeps them on its event heap.

Why a copy of the engine's rule and not a simpler one: which instants the scheduler sees
decides what it decides (a pass consumes the backfill cadence, starts a rank epoch, and the
power stage runs at every instant), so the live placer must be handed the same instants as the
engine for the same events. The engine's rule, mirrored here:

* after a pass, the scheduler's next backfill time ``nxt`` is kept when ``t < nxt`` and it is
  earlier than the earliest pending one (a later request does not replace an earlier one, and
  an instant once kept fires even if a later pass no longer needs it);
* after each power step, its next check time is kept the same way; when the earliest pending
  check has passed, the next one is taken whatever it is;
* a backfill instant wakes a pass; a power-check instant only runs the power stage; a scale
  instant (a service's quiet window ends) only the driver's ``scale_step``.
"""

from __future__ import annotations

import heapq
import math

PASS, POWER, SCALE = "pass", "power", "scale"


class Wakeups:
    """The pending instants (see the module docstring)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, str]] = []
        self._next_pass = math.inf
        self._next_power = math.inf
        self._next_scale = math.inf

    def due(self, now: float) -> bool:
        """Take every instant at or before ``now``; True when one of them wakes a pass."""
        wake = False
        while self._heap and self._heap[0][0] <= now:
            _, kind = heapq.heappop(self._heap)
            if kind == PASS:
                wake = True
                if self._next_pass <= now:
                    self._next_pass = math.inf
        return wake

    def after_pass(self, now: float, nxt: float | None) -> None:
        if nxt is not None and now < nxt < self._next_pass - 1e-9:
            self._next_pass = nxt
            heapq.heappush(self._heap, (nxt, PASS))

    def after_power(self, now: float, nxt: float | None) -> None:
        if self._next_power <= now:  # it has passed: the next one is taken whatever it is
            self._next_power = math.inf
        if nxt is not None and nxt > now and nxt < self._next_power - 1e-9:
            self._next_power = nxt
            heapq.heappush(self._heap, (nxt, POWER))

    def after_scale(self, now: float, nxt: float | None) -> None:
        """A service's quiet window ends at ``nxt`` (``core_scale``): an instant for the
        driver's ``scale_step``; it wakes no pass by itself (what it adds is an arrival)."""
        if self._next_scale <= now:
            self._next_scale = math.inf
        if nxt is not None and now < nxt < self._next_scale - 1e-9:
            self._next_scale = nxt
            heapq.heappush(self._heap, (nxt, SCALE))

    def next_s(self) -> float | None:
        """The earliest pending instant, or None."""
        return self._heap[0][0] if self._heap else None
