"""``drf``: weighted dominant resource fairness across tenants (Ghodsi et al., NSDI'11).

Each tenant's usage is a vector over (GPUs, GPU memory, host memory, CPUs) divided by the
cluster's capacity; its dominant share is the largest component, divided by the tenant's weight
(the paper's weighted DRF, section 4.3: a tenant of weight 2 is entitled to twice the dominant
share; Mesos' role weights). Each pass repeatedly offers the next start to the tenant with the
lowest weighted dominant share (progressive filling), trying that tenant's jobs in arrival
order with memory-aware first fit; a tenant none of whose jobs fits drops out of the pass.

Weights: ``Drf(weights={"tenant": w})`` (``make_policy("drf", weights=...)``); a tenant not
named weighs 1. Tenants carry no weight in ``proto.tenants`` or the traces, so a replay without
weights is plain DRF. Non-preemptive, as the paper's allocator (Mesos offers only freed
resources); so it has no ``-np`` twin.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Mapping

import numpy as np

from libs.sim.baselines.base import BasePolicy, shape
from libs.sim.cluster import EPS, SimCluster
from libs.sim.state import Assignment, SimContext, SimJob


def demand(job: SimJob) -> np.ndarray:
    s = job.spec
    return np.array([s.gpus, s.gpus * s.gpu_mem_gb, s.host_mem_gb, s.cpus])


class Drf(BasePolicy):
    name = "drf"

    def __init__(self, weights: Mapping[str, float] | None = None):
        self.weights = dict(weights or {})
        for tenant, w in self.weights.items():
            if not (isinstance(w, int | float) and math.isfinite(w) and w > 0):
                raise ValueError(f"weights[{tenant!r}] must be a positive number, got {w!r}")

    def weight(self, tenant: str) -> float:
        return float(self.weights.get(tenant, 1.0))

    def attach(self, ctx: SimContext) -> None:
        super().attach(ctx)
        c = ctx.cluster
        self.capacity = np.array(
            [
                c.gpu_count.sum(),
                (c.gpu_count * c.gpu_mem_gb).sum(),
                c.host_mem_gb.sum(),
                c.cpus.sum(),
            ],
            dtype=float,
        )
        self.usage: dict[str, np.ndarray] = {}

    def share(self, tenant: str) -> float:
        u = self.usage.get(tenant)
        return 0.0 if u is None else float((u / self.capacity).max()) / self.weight(tenant)

    def started(self, job: SimJob, now: float) -> None:
        t = job.spec.tenant
        self.usage[t] = self.usage.get(t, np.zeros(4)) + demand(job)

    def ended(self, job: SimJob, now: float) -> None:
        t = job.spec.tenant
        self.usage[t] = np.maximum(self.usage[t] - demand(job), 0.0)

    def schedule(
        self, queue: Collection[SimJob], view: SimCluster, running: Collection[SimJob], now: float
    ) -> list[Assignment]:
        by_tenant: dict[str, list[SimJob]] = {}
        for j in queue:
            by_tenant.setdefault(j.spec.tenant, []).append(j)
        extra: dict[str, np.ndarray] = {}
        heap = [(self.share(t), t) for t in sorted(by_tenant)]
        heapq.heapify(heap)
        failed: set[tuple] = set()
        out: list[Assignment] = []
        while heap and view.allocated_gpus < view.capacity_gpus - EPS:
            _, tenant = heapq.heappop(heap)
            jobs = by_tenant[tenant]
            placed = None
            i = 0
            while i < len(jobs):
                job = jobs[i]
                key = shape(job, True)
                s = job.spec
                if s.gpus <= view.widest(s.constraints) and not view.might_fit(
                    s.gpus, s.gpu_mem_gb
                ):
                    failed.add(key)
                elif key not in failed:
                    allocs = view.first_fit(job.spec, check_memory=True)
                    if allocs is not None:
                        placed = (job, allocs)
                        jobs.pop(i)
                        break
                    failed.add(key)
                i += 1
            if placed is None:
                continue  # nothing of this tenant fits now
            for a in placed[1]:
                view.allocate(a, notify=False)
            out.append(placed)
            extra[tenant] = extra.get(tenant, np.zeros(4)) + demand(placed[0])
            base = self.usage.get(tenant, np.zeros(4))
            dominant = float(((base + extra[tenant]) / self.capacity).max())
            heapq.heappush(heap, (dominant / self.weight(tenant), tenant))
        for _, allocs in out:
            for a in allocs:
                view.release(a, notify=False)
        return out
