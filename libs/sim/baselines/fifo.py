"""``fifo``: the seed's original strategy and Kubernetes' default GPU counting.

First come, first served in strict head-of-line order (the first job that does not fit blocks
every job behind it), first fit in cluster order, and only GPU count, host memory and CPUs are
checked: GPU memory is NOT, so a 40 GB model can land on a 16 GB T4 and die with OOM
(``libs.sim.failures``). A resubmitted job re-enters at the back of the queue, as a recreated pod
does.
"""

from __future__ import annotations

from collections.abc import Collection

from libs.sim.baselines.base import BasePolicy, first_fit_scan
from libs.sim.cluster import SimCluster
from libs.sim.state import Assignment, SimJob


class Fifo(BasePolicy):
    name = "fifo"
    checks_memory = False  # GPU count only: the engine must not skip passes on memory grounds

    def schedule(
        self, queue: Collection[SimJob], view: SimCluster, running: Collection[SimJob], now: float
    ) -> list[Assignment]:
        return first_fit_scan(queue, view, check_memory=False, blocking=True)
