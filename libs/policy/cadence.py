"""When a scheduling pass backfills: the clock both the simulator and the live placer keep.

Why a clock: walking every job below a blocked head on each arrival or finish is most of the
cost of a pass on a long queue, and buys seconds on waits of hours. Slurm splits the same way: an
event-driven main scheduler that stops at the first job that cannot start, and a backfill
scheduler every ``bf_interval``. ``PolicyConfig.backfill_interval_s`` is that interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True)
class BackfillCadence:
    """``take(now)``: does the pass at ``now`` backfill? (Then the next one may in
    ``interval_s``.) ``next_s``: when the next backfill is due."""

    interval_s: float
    next_s: float = -math.inf

    def take(self, now: float) -> bool:
        if now >= self.next_s:
            self.next_s = now + self.interval_s
            return True
        return False
