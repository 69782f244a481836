"""``gavel``: heterogeneity-aware max-min fairness over effective throughput (Narayanan et al.,
OSDI'20), in a simplified, event-driven, non-preemptive form.

Published Gavel solves, each round (6 min), an LP for an allocation matrix X (the share of time
each job spends on each GPU type) that maximises the minimum over jobs of effective throughput
(sum over types of X * throughput) normalised by the throughput the job would get with an equal
share of the cluster, then time-slices jobs across types round by round (preempting them).

What this version keeps: (1) the throughput matrix (1 / runtime of each job on each GPU type,
from the trace's measured per-type runtimes or the profile table); (2) max-min fairness as the
order: the job with the least normalised effective service so far (attained service divided by
its time in the system) goes first, ties by arrival; (3) heterogeneity awareness as the LP's
solutions exhibit it: each GPU type goes to the jobs with the largest *comparative advantage*
on it, i.e. the job's throughput on the type divided by the mean throughput of the waiting jobs
on that type, among the types with room now.

What it does NOT model: the LP itself (no solver dependency), rounds, time-slicing and
preemption (a job keeps its GPUs until it ends), and space sharing. Placement inside a type is
memory-aware first fit; a job never blocks the jobs behind it.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection

import numpy as np

from libs.sim.baselines.base import BasePolicy, shape
from libs.sim.cluster import EPS, SimCluster
from libs.sim.state import Assignment, SimContext, SimJob

WINDOW = 512  # waiting jobs considered per pass (the fairness order's head)


class Gavel(BasePolicy):
    name = "gavel"

    def attach(self, ctx: SimContext) -> None:
        super().attach(ctx)
        c = ctx.cluster
        self.type_masks = [c.model_index == m for m in range(len(c.models))]

    def schedule(
        self, queue: Collection[SimJob], view: SimCluster, running: Collection[SimJob], now: float
    ) -> list[Assignment]:
        def fairness(j: SimJob) -> tuple:
            in_system = max(1e-9, now - j.submit_s)
            return (j.attained_gpu_s / in_system / max(j.spec.gpus, 1e-9), j.submit_s, j.idx)

        if any(j.attained_gpu_s > 0 for j in queue):
            head = sorted(queue, key=fairness)[:WINDOW]
        else:
            head = list(itertools.islice(queue, WINDOW))
        if not head:
            return []
        thr = 1.0 / np.stack([j.runtime_s for j in head])  # jobs x types
        advantage = thr / thr.mean(axis=0, keepdims=True)
        order = np.argsort(-advantage, axis=1, kind="stable")
        failed: set[tuple] = set()
        out: list[Assignment] = []
        for row, job in enumerate(head):
            if view.allocated_gpus >= view.capacity_gpus - EPS:
                break
            s = job.spec
            if s.gpus <= view.widest(s.constraints) and not view.might_fit(s.gpus, s.gpu_mem_gb):
                continue
            key = shape(job, True)
            masks = [self.type_masks[m] for m in order[row]]
            if job.spec.gpus > view.gpu_count.max():
                masks.append(None)  # a gang wider than a node may span GPU types
            for m, mask in zip([*order[row], -1], masks, strict=False):
                if (key, int(m)) in failed:
                    continue
                allocs = view.first_fit(job.spec, check_memory=True, node_mask=mask)
                if allocs is None:
                    failed.add((key, int(m)))
                    continue
                for a in allocs:
                    view.allocate(a, notify=False)
                out.append((job, allocs))
                break
        for _, allocs in out:
            for a in allocs:
                view.release(a, notify=False)
        return out
