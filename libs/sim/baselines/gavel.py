"""``gavel``: heterogeneity-aware max-min fairness over effective throughput (Narayanan et al.,
OSDI'20), in a simplified, event-driven, non-preemptive form.

Published Gavel solves, each round (6 min), an LP for an allocation matrix X (the share of time
each job spends on each GPU type) that maximises the minimum over jobs of effective throughput
(sum over types of X * throughput) normalised by the throughput the job would get with an equal
share of the cluster, then time-slices jobs across types round by round (preempting them).

What this version keeps: (1) the throughput matrix (1 / runtime of each job on each GPU type,
from the trace's measured per-type runtimes or the profile table); (2) max-min fairness as the
order: the job with the least normalised effective service so far (attained GPU-seconds divided
by its time in the system and its GPUs) goes first, ties by arrival; (3) heterogeneity awareness
as the LP's solutions exhibit it under contention: GPU types are filled fastest first (by mean
throughput), and each type's free GPUs go first to the waiting jobs that gain most from it
(throughput on that type / throughput on the job's slowest type), so a job that barely speeds
up on a V100 leaves it to one that speeds up 3x. A job not placed on a faster type is offered
the next one.

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
        gain = thr / thr.min(axis=1, keepdims=True)
        type_order = np.argsort(-thr.mean(axis=0), kind="stable")
        failed: set[tuple] = set()
        placed: set[int] = set()
        out: list[Assignment] = []
        for m in type_order:
            mask = self.type_masks[m]
            if not (view.free_share[mask] > EPS).any():
                continue  # this type is full
            for row in np.argsort(-gain[:, m], kind="stable"):
                if int(row) in placed:
                    continue
                allocs = self._try(head[row], view, mask, (int(m),), failed)
                if allocs is not None:
                    placed.add(int(row))
                    out.append((head[row], allocs))
                    if not (view.free_share[mask] > EPS).any():
                        break
        for row, job in enumerate(head):  # gangs wider than one type's nodes may span types
            if row not in placed and job.spec.gpus > view.widest(job.spec.constraints):
                allocs = self._try(job, view, None, ("any",), failed)
                if allocs is not None:
                    out.append((job, allocs))
        for _, allocs in out:
            for a in allocs:
                view.release(a, notify=False)
        return out

    @staticmethod
    def _try(job: SimJob, view: SimCluster, mask, tag: tuple, failed: set) -> list | None:
        s = job.spec
        if s.gpus <= view.widest(s.constraints) and not view.might_fit(s.gpus, s.gpu_mem_gb):
            return None
        key = (shape(job, True), tag)
        if key in failed:
            return None
        allocs = view.first_fit(s, check_memory=True, node_mask=mask)
        if allocs is None:
            failed.add(key)
            return None
        for a in allocs:
            view.allocate(a, notify=False)
        return allocs
