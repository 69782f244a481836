"""``--power-saving``: which compared policies may switch idle nodes off, by the same rule.

Why: an energy comparison between a policy that may suspend idle nodes and one that may not
measures who may switch nodes off, not the decisions. The modes:

* ``mosaic`` (the default, the seed-style comparison): Mosaic runs its power stage, the
  baselines are the published strategies and never suspend;
* ``all`` (the best-peer comparison): every baseline is wrapped in ``PowerSaving``, which
  drives the policy core's own power rule (``libs.policy.power.plan`` and the due test of
  ``libs.policy.stages.power``, compiled in ``libs.policy.fast``) with the same
  ``PolicyConfig`` timings Mosaic uses (``suspend_after_s``, ``resume_s``,
  ``warm_reserve_frac``, ``power_demand_cap``) and the same warm reserve, fed by the
  baseline's starts (``libs.policy.warm``);
* ``none``: nobody suspends, Mosaic included (``power_saving=False``).

What the wrapper does not take from Mosaic: the green-first wake order (green jobs are
Mosaic's scoring, ``scores.is_green``) and reservations (the baselines reserve nothing); the
demand that wakes nodes is the jobs the baseline's last pass left waiting, in queue order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

import msgspec
import numpy as np

from libs.policy import fast as K
from libs.policy import power
from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.power_state import wake_orders
from libs.policy.warm import WarmHistory
from libs.sim.cluster import SimCluster
from libs.sim.state import Assignment, SimContext, SimJob
from proto.jobs import HIGH_PRIORITY, JobSpec
from proto.ledger import Allocation

MODES = ("mosaic", "all", "none")
RULES = {
    "mosaic": "mosaic suspends idle nodes (its power stage); the baselines never do",
    "all": "every policy suspends idle nodes by the policy core's rule (libs.policy.power) "
    "with the same PolicyConfig timings",
    "none": "no policy suspends nodes (mosaic with power_saving=False)",
}
HOLD_ID = "power-hold"  # the placeholder that keeps a sleeping node out of a baseline's sight


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"power_saving must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def apply_mode(name: str, policy: Any, mode: str, cfg: PolicyConfig) -> Any:
    """``policy`` (built under ``name``) as ``mode`` wants it: Mosaic with its power stage on
    or off, a baseline wrapped or left alone. ``cfg``: the timings a wrapped baseline uses."""
    check_mode(mode)
    if name == "mosaic":
        if mode == "none" and policy.cfg.power_saving:
            return type(policy)(dataclasses.replace(policy.cfg, power_saving=False))
        return policy
    if mode == "all" and getattr(policy, "power_step", None) is None:
        return PowerSaving(policy, cfg)
    return policy


class PowerSaving:
    """A baseline whose idle nodes sleep by the policy core's power rule.

    The baseline decides placements as before; it never sees a sleeping or booting node (each
    is booked whole by a placeholder for the length of each call into the baseline, then freed:
    the engine's ledger is as it was). The wrapper keeps a ``ClusterView`` in step with the
    engine's starts and ends, the nodes' idle times and power states, and asks
    ``power.plan`` after each instant, as ``core.Scheduler.power_step`` does for Mosaic.
    """

    def __init__(self, inner: Any, cfg: PolicyConfig) -> None:
        self.inner = inner
        self.name = inner.name
        self.power_cfg = dataclasses.replace(cfg, power_saving=True)
        self.resume_s = self.power_cfg.resume_s
        self.checks_memory = getattr(inner, "checks_memory", True)
        if getattr(inner, "next_pass_s", None) is not None:
            self.next_pass_s = inner.next_pass_s
        if getattr(inner, "move_step", None) is not None:
            self.move_step = self._move_step
            self.next_move_s = inner.next_move_s
        self._blocked: list[JobSpec] = []

    # ----- the engine's calls, passed on --------------------------------------------------
    def attach(self, ctx: SimContext) -> None:
        self.inner.attach(ctx)
        cluster: SimCluster = ctx.cluster  # type: ignore[assignment]
        self.cluster = cluster
        self.view = ClusterView.build(cluster.nodes)
        n = len(cluster.nodes)
        self.idle_since = np.zeros(n)  # every node idle from the start, as Mosaic's
        self.suspended = np.zeros(n, dtype=bool)
        self.resuming = np.zeros(n, dtype=bool)
        self._wake_order = wake_orders(self.view, ctx.profiles)[0]  # fastest first
        self._widest = int(self.view.gpu_total.max())
        self.warm = WarmHistory(self.view, self.power_cfg)

    def can_ever_place(self, job: SimJob) -> bool:
        return self.inner.can_ever_place(job)

    def enqueued(self, job: SimJob, now: float) -> None:
        self.inner.enqueued(job, now)

    def started(self, job: SimJob, now: float) -> None:
        high = job.spec.priority >= HIGH_PRIORITY
        for a in job.allocs:
            self.view.allocate(a)
            i = self.view.index[a.node]
            self.idle_since[i] = np.nan
            gpus = len(a.gpu_indices) * a.gpu_share
            self.warm.started(int(self.view.model_idx[i]), gpus, high, now)
        self.inner.started(job, now)

    def ended(self, job: SimJob, now: float) -> None:
        view = self.view
        for a in job.allocs:
            view.release(a)
            i = view.index[a.node]
            if view.whole_free[i] >= view.gpu_total[i]:
                self.idle_since[i] = now
        self.inner.ended(job, now)

    def schedule(
        self, queue: Collection[SimJob], view: SimCluster, running: Collection[SimJob], now: float
    ) -> list[Assignment]:
        with _Held(view, self.suspended | self.resuming):
            chosen = self.inner.schedule(queue, view, running, now)
        started = {job.idx for job, _ in chosen}
        cap = self.power_cfg.power_demand_cap
        blocked: list[JobSpec] = []
        for job in queue:
            if job.idx not in started:
                blocked.extend(_per_node(job.spec, self._widest))
                if len(blocked) >= cap:
                    break
        self._blocked = blocked[:cap]
        return chosen

    def _move_step(self, now: float) -> list:
        with _Held(self.cluster, self.suspended | self.resuming):
            return self.inner.move_step(now)

    # ----- power ---------------------------------------------------------------------------
    def power_step(self, now: float) -> tuple[list[str], list[str], float | None]:
        """(node ids to suspend, node ids to resume, when to ask again or None): the policy
        core's rule on this baseline's nodes and blocked jobs."""
        cfg = self.power_cfg
        _due, any_asleep, any_due, nxt = K.power_due(
            now,
            self.idle_since,
            self.suspended,
            self.resuming,
            power.empty_nodes(self.view),
            cfg.suspend_after_s,
        )
        plan = power.PowerPlan((), ())
        keep, keep_next = self.warm.keep(now) if cfg.warm_reserve else (None, np.inf)
        if any_asleep or any_due:
            plan = power.plan(
                self.view,
                idle_s=now - self.idle_since,
                suspended=self.suspended,
                resuming=self.resuming,
                blocked=self._blocked,
                reserved=(),
                cfg=cfg,
                prefer=self._wake_order,
                keep_nodes=keep,
            )
        for i in plan.suspend:
            self.suspended[i] = True
        for i in plan.resume:
            self.suspended[i] = False
            self.resuming[i] = True
        if plan.suspend or plan.resume:  # the next look: when the next idle node becomes due
            nxt = K.power_due(
                now,
                self.idle_since,
                self.suspended,
                self.resuming,
                power.empty_nodes(self.view),
                cfg.suspend_after_s,
            )[3]
        if any_due:  # a due node the reserve keeps sleeps once the reserve shrinks by ageing
            nxt = min(nxt, keep_next)
        ids = self.view.node_ids
        next_s = None if nxt == np.inf else float(nxt)
        return [ids[i] for i in plan.suspend], [ids[i] for i in plan.resume], next_s

    def power_resumed(self, node_id: str, now: float) -> None:
        i = self.view.index[node_id]
        self.resuming[i] = False
        self.idle_since[i] = now


def _per_node(spec: JobSpec, widest: int) -> list[JobSpec]:
    """A blocked job as ``power.plan`` reads demand (one node per job): a gang wider than any
    node is the node-sized pieces it would occupy (host memory and CPUs split in proportion),
    so a baseline's cross-node gang wakes as many nodes as it needs."""
    if spec.gpus <= widest:
        return [spec]
    pieces: list[JobSpec] = []
    left = round(spec.gpus)
    while left > 0:
        g = min(widest, left)
        share = g / spec.gpus
        pieces.append(
            msgspec.structs.replace(
                spec, gpus=float(g), host_mem_gb=spec.host_mem_gb * share, cpus=spec.cpus * share
            )
        )
        left -= g
    return pieces


class _Held:
    """Books the masked nodes whole (GPUs, host memory, CPUs) on the engine's ledger for the
    length of a ``with`` block, without notifying anyone, then frees them: a baseline's scan
    sees them full. They are empty (a node sleeps or boots only empty, and the engine refuses a
    start on one), so the booking always fits."""

    def __init__(self, cluster: SimCluster, mask: np.ndarray) -> None:
        self.cluster = cluster
        self.allocs = [
            Allocation(
                job_id=HOLD_ID,
                node=cluster.nodes[i].id,
                gpu_indices=tuple(range(int(cluster.gpu_count[i]))),
                gpu_share=1.0,
                gpu_mem_gb=0.0,
                host_mem_gb=float(cluster.host_free_gb[i]),
                cpus=float(cluster.cpus_free[i]),
                time=0.0,
            )
            for i in np.flatnonzero(mask).tolist()
        ]

    def __enter__(self) -> _Held:
        for a in self.allocs:
            self.cluster.allocate(a, notify=False)
        return self

    def __exit__(self, *exc: object) -> None:
        for a in self.allocs:
            self.cluster.release(a, notify=False)
