"""``mosaic``: the simulator drives ``libs.policy.scheduler.schedule``, the live placer's code.

Nothing of Mosaic's policy is reimplemented here. This adapter only translates: the engine's
jobs become ``PendingJob``/``RunningJob`` records, the policy's ``ClusterView`` is built once and
kept in step with the simulator's ledger through ``allocate``/``release`` (never rebuilt), the
pending queue is an incrementally maintained ``PendingQueue``, and tenant usage (for the DRF
term of the priority) is kept per tenant in ``RESOURCES`` order. A retried job keeps its
original submit time as ``enqueued_at``, so aging is not reset by a failure.

Expected ends handed to the scheduler (for backfill reservations) are what the live placer
would know: start + the profile's runtime estimate on that GPU model, not the simulator's truth.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from libs.policy import backfill as B
from libs.policy import filters as F
from libs.policy import scheduler
from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.placement import to_allocation
from libs.policy.queue import PendingQueue
from libs.policy.types import PendingJob, RunningJob
from libs.sim.baselines.base import BasePolicy
from libs.sim.cluster import SimCluster
from libs.sim.state import Assignment, SimContext, SimJob
from proto.ledger import Allocation


def usage_vector(job: SimJob) -> np.ndarray:
    s = job.spec
    return np.array([s.gpus, s.gpus * s.gpu_mem_gb, s.host_mem_gb, s.cpus])


class Mosaic(BasePolicy):
    name = "mosaic"

    def __init__(self, cfg: PolicyConfig | None = None):
        self.cfg = cfg or PolicyConfig.default()

    def attach(self, ctx: SimContext) -> None:
        super().attach(ctx)
        cluster: SimCluster = ctx.cluster  # type: ignore[assignment]
        self.view = ClusterView.build(cluster.nodes)
        cluster.policy_view = self.view
        cluster.add_hook(self._mirror)
        self.profiles = ctx.profiles
        self.queue = PendingQueue()
        self.by_id: dict[str, SimJob] = {}
        self.running = B.RunningSet()  # kept across passes, as the scheduler asks
        self.usage: dict[str, np.ndarray] = {}
        self._applied: set[tuple] = set()

    def can_ever_place(self, job: SimJob) -> bool:
        return F.never_fits(job.spec, self.view.nodes) is None

    # ----- keeping the policy's records in step with the engine ----------------------------
    def _mirror(self, kind: str, alloc: Allocation) -> None:
        key = (alloc.job_id, alloc.node, alloc.gpu_indices)
        if kind == "allocate":
            if key in self._applied:
                self._applied.discard(key)  # the scheduler already applied it to the view
                return
            self.view.allocate(alloc)
        else:
            self.view.release(alloc)

    def enqueued(self, job: SimJob, now: float) -> None:
        self.by_id[job.spec.id] = job
        self.queue.add(PendingJob(job.spec, enqueued_at=job.submit_s, attempt=job.attempts + 1))

    def started(self, job: SimJob, now: float) -> None:
        self.queue.remove(job.spec.id)
        t = job.spec.tenant
        self.usage[t] = self.usage.get(t, np.zeros(4)) + usage_vector(job)
        est_end = now + self.profiles.runtime_s(job.spec, job.model)
        (a,) = job.allocs  # Mosaic places a job on one node
        self.running.add(
            RunningJob(job.spec, self.view.index[a.node], a.gpu_indices, a.gpu_share, est_end)
        )

    def ended(self, job: SimJob, now: float) -> None:
        t = job.spec.tenant
        self.usage[t] = np.maximum(self.usage[t] - usage_vector(job), 0.0)
        self.running.remove(job.spec.id)

    # ----- the pass ------------------------------------------------------------------------
    def schedule(
        self, queue: Collection[SimJob], view: SimCluster, running: Collection[SimJob], now: float
    ) -> list[Assignment]:
        res = scheduler.schedule(
            self.queue,
            self.view,
            self.running,
            now=now,
            tenant_usage=self.usage,
            profiles=self.profiles,
            cfg=self.cfg,
            reasons=False,
        )
        out: list[Assignment] = []
        for pj, placement in res.assignments:
            alloc = to_allocation(pj.spec, placement, now, pj.attempt)
            self._applied.add((alloc.job_id, alloc.node, alloc.gpu_indices))
            out.append((self.by_id[pj.spec.id], [alloc]))
        return out
