"""``bestfit``: FGD's best-fit baseline (Weng et al., ATC'23, section 6), for the fill experiment.

The paper's best-fit puts a task on the node with the least resources left, a weighted sum of
the resource dimensions. Here: the node whose free share of GPUs and of CPUs, after the task,
averaged with equal weights, is smallest (the paper does not print its weights; equal weights
on GPU and CPU are our choice, host memory is not weighed); ties go to the lowest node index.
Inside the node a fractional task takes the GPU with the least free share that holds it (the
tightest fit), a k-GPU task the lowest-numbered free GPUs.
"""

from __future__ import annotations

import numpy as np

from libs.policy.cluster import EPS
from libs.sim.fill_policy import Choice, FillPolicy, fractional_slots, lowest_whole
from proto.jobs import JobSpec


class BestFit(FillPolicy):
    name = "bestfit"

    def choose(self, spec: JobSpec, fit: np.ndarray) -> Choice | None:
        v = self.view
        nodes = np.flatnonzero(fit)
        gpus = float(spec.gpus) if spec.gpus < 1.0 - EPS else float(round(spec.gpus))
        gpu_left = (v.gpu_free[nodes].sum(axis=1) - gpus) / np.maximum(v.gpu_total[nodes], 1)
        cpu_left = (v.cpus_free[nodes] - spec.cpus) / np.maximum(v.cpus[nodes], EPS)
        n = int(nodes[np.argmin(0.5 * gpu_left + 0.5 * cpu_left)])
        if spec.gpus <= 0:
            return n, (), 0.0
        if spec.gpus < 1.0 - EPS:
            cand = fractional_slots(v, n, float(spec.gpus))
            return n, (int(cand[np.argmin(v.gpu_free[n, cand])]),), float(spec.gpus)
        return n, lowest_whole(v, n, round(spec.gpus)), 1.0
