"""``tiresias``: discretised two-dimensional least-attained-service (Gu et al., NSDI'19).

A job's attained service is GPUs x time it has held them (the "2D" of 2D-LAS), summed over its
attempts. Jobs fall into priority queues by attained service; lower queues go first, FIFO inside
a queue, and a job that has waited longer than ``starve_factor`` x its attained run time is
promoted to the top queue (the paper's STARVELIMIT). Queue boundaries: one boundary at 3,200
GPU-seconds (two queues), in the range of the thresholds the paper explores.

What is NOT modelled: preemption. The published Tiresias preempts running jobs that fall into a
lower queue; this variant is preemption-free (the brief allows it), so attained service only
separates jobs that ran before (a resubmission after an OOM failure) from fresh ones. Placement
is memory-aware first fit and non-blocking (a job that does not fit does not stop the others),
the consolidation-aware placement of the paper reduces here to first fit on one node when the
job fits on one.
"""

from __future__ import annotations

from collections.abc import Collection

from libs.sim.baselines.base import BasePolicy, first_fit_scan
from libs.sim.cluster import SimCluster
from libs.sim.state import Assignment, SimJob

QUEUE_BOUNDARIES_GPU_S: tuple[float, ...] = (3200.0,)
STARVE_FACTOR = 2.0


class Tiresias(BasePolicy):
    name = "tiresias"

    def __init__(self, boundaries: tuple[float, ...] = QUEUE_BOUNDARIES_GPU_S):
        self.boundaries = boundaries

    def queue_of(self, job: SimJob, now: float) -> int:
        served = job.attained_gpu_s
        if served > 0 and now - job.enqueue_s > STARVE_FACTOR * job.run_s:
            return 0
        return sum(served >= b for b in self.boundaries)

    def schedule(
        self, queue: Collection[SimJob], view: SimCluster, running: Collection[SimJob], now: float
    ) -> list[Assignment]:
        if any(j.attained_gpu_s > 0 for j in queue):
            ordered = sorted(queue, key=lambda j: (self.queue_of(j, now), j.submit_s, j.idx))
        else:
            ordered = queue  # all in queue 0, already in arrival order
        return first_fit_scan(ordered, view, check_memory=True, blocking=False)
