"""The engine's power saving: suspending and resuming nodes a policy's ``power_step`` names,
and the standby energy they save (see ``engine``'s docstring for the model).

Apart from ``engine`` because it is its own account (when each node went down, the idle
power it did not draw) checked against its own rules (a policy may not suspend a busy or
sleeping node, nor resume an awake one); ``Engine`` inherits it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from libs.sim.event_kinds import POWER, RESUMED

if TYPE_CHECKING:
    from libs.sim.engine import Engine


class PowerAccounting:
    """``Engine``'s power saving (see the module docstring)."""

    def _power_step(self: Engine, t: float) -> None:
        suspend, resume, next_s = self._power(t)  # type: ignore[misc]
        c = self.cluster
        for nid in suspend:
            n = self._node_idx[nid]
            if c._whole_free[n] < c.gpu_count[n] or self._down_since[n] == self._down_since[n]:
                raise AssertionError(f"{self.policy.name} suspended {nid}: busy or already down")
            self._down_since[n] = t
        for nid in resume:
            n = self._node_idx[nid]
            if self._down_since[n] != self._down_since[n]:
                raise AssertionError(f"{self.policy.name} resumed {nid}, which is not suspended")
            self._account_down(n, t)
            self._up_at[n] = t + float(self.policy.resume_s)  # type: ignore[attr-defined]
            self._push(self._up_at[n], RESUMED, n)
        if self._next_power <= t:  # it has passed: the next one is taken whatever it is
            self._next_power = float("inf")
        if next_s is not None and next_s > t and next_s < self._next_power - 1e-9:
            self._next_power = next_s
            self._push(next_s, POWER, 0)

    def _account_down(self: Engine, n: int, t: float) -> None:
        dur = t - float(self._down_since[n])
        self.idle_saved_j += (self._node_idle_w[n] - self._node_standby_w[n]) * dur
        self.node_suspend_s += dur
        self._down_since[n] = np.nan
