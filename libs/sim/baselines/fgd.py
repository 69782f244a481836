"""``fgd``: Fragmentation Gradient Descent (Weng et al., ATC'23), for the fill experiment.

Written from the paper's description: for each way to place the task (a node, and for a
fractional task each GPU of it with the share free), the growth of that node's expected
fragmentation for the target workload (``libs.policy.stages.frag``); the option with the least
growth wins, ties to the lowest node index and GPU. Where this differs from the paper's
implementation: the target workload is learnt from the pods that arrived so far (relearnt at
each whole percent of arrived GPU request), one class per (GPU request, GPU models) with the
median CPUs and memory of its pods, where FGD takes the popular pod shapes of the trace; a
k-GPU task's GPUs inside the node are the lowest-numbered free ones (whole free GPUs are alike
for the measure).
"""

from __future__ import annotations

import numpy as np

from libs.policy.stages.frag import Workload, growth, slot_tuple
from libs.sim.fill_policy import Choice, FillPolicy
from proto.jobs import JobSpec


class Fgd(FillPolicy):
    name = "fgd"

    def learn(self, work: Workload) -> None:
        super().learn(work)
        self.allowed = work.allowed(self.view)

    def choose(self, spec: JobSpec, fit: np.ndarray) -> Choice | None:
        nodes, slots, g = growth(spec, self.view, fit, self.work, self.allowed)
        if len(nodes) == 0:
            return None
        i = int(np.argmin(g))  # first of the least growth: lowest node, then lowest GPU
        share = float(spec.gpus) if spec.gpus < 1 else 1.0
        return int(nodes[i]), slot_tuple(slots[i]), share
