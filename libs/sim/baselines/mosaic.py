"""``mosaic``: the simulator drives ``libs.policy.scheduler.schedule``, the live placer's code.

Nothing of Mosaic's policy is reimplemented here. This adapter only translates: the engine's
jobs become ``PendingJob``/``RunningJob`` records, the policy's ``ClusterView`` is built once and
kept in step with the simulator's ledger through ``allocate``/``release`` (never rebuilt), the
pending queue is an incrementally maintained ``PendingQueue``, and tenant usage (for the DRF
term of the priority) is kept per tenant in ``RESOURCES`` order. A retried job keeps its
original submit time as ``enqueued_at``, so aging is not reset by a failure.

Power saving: ``power_step`` asks ``libs.policy.power.plan`` (the policy's pure decision) which
empty nodes to suspend and which to resume; a node that is down or booting is cordoned in the
policy's view, so ``schedule`` never places on it. The engine does the energy accounting.

Expected ends handed to the scheduler (for backfill reservations) are what the live placer
would know: start + the profile's runtime estimate on that GPU model, not the simulator's truth.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from libs.policy import backfill as B
from libs.policy import fast as K
from libs.policy import filters as F
from libs.policy import power, scheduler
from libs.policy.cadence import BackfillCadence
from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.placement import to_allocation
from libs.policy.queue import PendingQueue
from libs.policy.scores import is_green
from libs.policy.types import PendingJob, RunningJob
from libs.policy.warmup import warm_up
from libs.sim.baselines.base import BasePolicy
from libs.sim.cluster import SimCluster
from libs.sim.state import Assignment, SimContext, SimJob
from proto.jobs import WORKLOAD_CLASSES
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
        # the pass's compiled loops are loaded now, not inside the replay's first passes
        warm_up(self.cfg, ctx.profiles)
        cluster: SimCluster = ctx.cluster  # type: ignore[assignment]
        self.view = ClusterView.build(cluster.nodes)
        cluster.policy_view = self.view
        cluster.add_hook(self._mirror)
        self.profiles = ctx.profiles
        self.queue = PendingQueue()
        self.by_id: dict[str, SimJob] = {}
        self.running = B.RunningSet()  # kept across passes, as the scheduler asks
        self.usage: dict[str, np.ndarray] = {}
        self._usage_of: dict[int, np.ndarray] = {}  # usage_vector of each running job
        self._ever: dict[tuple, bool] = {}  # can_ever_place per request shape
        self._applied: set[tuple] = set()
        n = len(self.view.node_ids)
        self.resume_s = self.cfg.resume_s
        self._idle_since = np.zeros(n)  # NaN while the node holds a job
        self._suspended = np.zeros(n, dtype=bool)
        self._resuming = np.zeros(n, dtype=bool)
        # the jobs the last backfill pass could not start, in rank order: their queue entries
        # (PendingQueue.seq), entry -> position, started since, request shape, green
        self._blocked_key = b""  # their queue entries' bytes (``PendingQueue.seq``)
        self._blocked_at: dict[float, int] = {}
        self._blocked_gone = np.zeros(0, dtype=bool)
        self._blocked_shape = np.zeros(0, dtype=np.int64)
        self._blocked_green = np.zeros(0, dtype=bool)
        self._blocked_ver = 0  # bumped when the blocked jobs change (the power memo's key)
        self._plan_key: tuple | None = None  # inputs of the last power plan, when it was empty
        # (inputs, view.gen or None, next due time) of a power step that decided nothing
        self._last_step: tuple | None = None
        self._blocked_starts = 0  # blocked jobs started since (they leave the queue only so)
        # power.Demand of the blocked jobs still queued, by kind, and what they were built for
        self._demands: dict[str, power.Demand] = {}
        self._demand_key: tuple | None = None
        self._reserved: tuple[int, ...] = ()
        self._cadence = BackfillCadence(self.cfg.backfill_interval_s)
        self._tick_at: float | None = None
        # nodes to wake first: fastest GPU model first (mean speed over workload classes)
        sp = self.profiles.speed_matrix(tuple(self.view.models), WORKLOAD_CLASSES).mean(axis=1)
        self._wake_order = np.lexsort((np.arange(n), -sp[self.view.model_idx]))
        # for green jobs (scores.is_green): greenest GPU model first (mean energy per unit of
        # work over workload classes), so their demand does not wake a fast, power-hungry node
        epw = (
            self.profiles.power_matrix(tuple(self.view.models), WORKLOAD_CLASSES)
            / self.profiles.speed_matrix(tuple(self.view.models), WORKLOAD_CLASSES)
        ).mean(axis=1)
        self._green_wake_order = np.lexsort((np.arange(n), epw[self.view.model_idx]))

    def can_ever_place(self, job: SimJob) -> bool:
        # per request shape: the nodes never change in a run (never_fits would check that
        # the node list is the same, 170 identity tests, on every arrival)
        key = F.shape_key(job.spec)
        hit = self._ever.get(key)
        if hit is None:
            hit = self._ever[key] = F.never_fits(job.spec, self.view.nodes) is None
        return hit

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
        if kind == "allocate":
            self._idle_since[self.view.index[alloc.node]] = np.nan

    def enqueued(self, job: SimJob, now: float) -> None:
        self.by_id[job.spec.id] = job
        self.queue.add(PendingJob(job.spec, enqueued_at=job.submit_s, attempt=job.attempts + 1))
        # scores.is_green per queued job (fixed per spec), a column that moves with its row
        self._green_col()[self.queue.position(job.spec.id), 0] = is_green(job.spec, self.cfg)

    def started(self, job: SimJob, now: float) -> None:
        seq = self.queue.seq()[self.queue.position(job.spec.id)]
        self.queue.remove(job.spec.id)
        k = self._blocked_at.get(seq)
        if k is not None:  # a blocked job left the queue (only starting does that)
            self._blocked_starts += 1
            self._blocked_gone[k] = True
        t = job.spec.tenant
        vec = self._usage_of[job.idx] = usage_vector(job)  # kept for ``ended``
        cur = self.usage.get(t)
        self.usage[t] = vec.copy() if cur is None else cur + vec
        est_end = now + self.profiles.runtime_s(job.spec, job.model)
        (a,) = job.allocs  # Mosaic places a job on one node
        self.running.add(
            RunningJob(job.spec, self.view.index[a.node], a.gpu_indices, a.gpu_share, est_end)
        )

    def ended(self, job: SimJob, now: float) -> None:
        for a in job.allocs:  # the engine released them just before
            i = self.view.index[a.node]
            if self.view.whole_free[i] >= self.view.gpu_total[i]:
                self._idle_since[i] = now
        t = job.spec.tenant
        self.usage[t] = np.maximum(self.usage[t] - self._usage_of.pop(job.idx), 0.0)
        self.running.remove(job.spec.id)

    # ----- the pass ------------------------------------------------------------------------
    def schedule(
        self, queue: Collection[SimJob], view: SimCluster, running: Collection[SimJob], now: float
    ) -> list[Assignment]:
        full = self._cadence.take(now)
        res = scheduler.schedule(
            self.queue,
            self.view,
            self.running,
            now=now,
            tenant_usage=self.usage,
            profiles=self.profiles,
            cfg=self.cfg,
            reasons=False,
            backfill=full,
            walked_limit=self.cfg.power_demand_cap,  # all the resume decision reads
        )
        # a pass that did not backfill and left jobs waiting: pass again when backfill is due
        waiting = len(self.queue) > len(res.assignments)
        self._tick_at = self._cadence.next_s if waiting and not full else None
        out: list[Assignment] = []
        if self.cfg.power_saving and full:
            # the blocked jobs as the last backfill pass saw them (a pass in between stops at
            # the head and would hide the rest from the resume decision)
            cap = self.cfg.power_demand_cap
            n_placed = len(res.assignments)
            if res.rank is not None:
                rows = res.rank.order[: cap + n_placed]
            else:
                rows = np.zeros(0, dtype=np.int64)
            if n_placed:  # placed jobs are still queued (the engine starts them after)
                pos = self.queue.position
                for pj, _ in res.assignments:  # a few per pass: one comparison each
                    rows = rows[rows != pos(pj.spec.id)]
            # every walked job that did not start: waiting for capacity, for a reserved node or
            # for a fast GPU (SlowGPU: fast nodes wake first, see _wake_order)
            rows = rows[:cap]
            # the same blocked jobs as last time (by their queue entry's insertion number):
            # nothing to rebuild. Most backfill passes end so, and the spec list is only read
            # when a power plan is made
            seqs = self.queue.seq()[rows]
            key = seqs.tobytes()  # whole numbers as floats: equal bytes iff equal lists
            if key != self._blocked_key:
                self._blocked_ver += 1
                self._blocked_key = key
                self._blocked_at = {q: k for k, q in enumerate(seqs.tolist())}
                self._blocked_gone = np.zeros(len(rows), dtype=bool)
                self._blocked_shape = self.queue.shapes()[0][rows]
                self._blocked_green = self._green_col()[rows, 0] == 1.0
            resv = [res.reservation, *res.extra_reservations]
            self._reserved = tuple(r.node_index for r in resv if r is not None)
        for pj, placement in res.assignments:
            alloc = to_allocation(pj.spec, placement, now, pj.attempt)
            self._applied.add((alloc.job_id, alloc.node, alloc.gpu_indices))
            out.append((self.by_id[pj.spec.id], [alloc]))
        return out

    def next_pass_s(self) -> float | None:
        """When the engine should run a pass even without an event (the next backfill)."""
        return self._tick_at

    # ----- power saving (the engine calls these; see libs.policy.power) --------------------
    def power_step(self, now: float) -> tuple[list[str], list[str], float | None]:
        """(node ids to suspend, node ids to resume, when to ask again or None)."""
        if not self.cfg.power_saving:
            return [], [], None
        # nothing changed since a step that decided nothing, and no node has become due to
        # sleep since (that happens at the returned time at the earliest): the same answer.
        # Of the view, a step reads which nodes are empty (``view.empty_gen``; a node's idle
        # time starts when it empties) and, only when some node is due to sleep, the free
        # GPUs of the warm reserve (``view.gen``): most events start or end a job on a node
        # that stays busy, and change neither
        key = (
            self.view.empty_gen,
            self._blocked_ver,
            self._blocked_starts,
            self._reserved,
        )
        last = self._last_step
        if (
            last is not None
            and last[0] == key
            and (last[1] is None or last[1] == self.view.gen)
            and (last[2] is None or now < last[2])
        ):
            return [], [], last[2]
        due, any_asleep, any_due, nxt = self._due(now)
        if any_asleep or any_due:
            p = self._power_plan(now - self._idle_since, due)
        else:  # nothing asleep and nothing to put to sleep (power.plan would say so)
            p = power.PowerPlan((), ())
        ids = self.view.node_ids
        for i in p.suspend:
            self._suspended[i] = True
            self.view.set_cordoned(ids[i], True)
        for i in p.resume:
            self._suspended[i] = False
            self._resuming[i] = True
        if p.suspend or p.resume:  # next look: when the next awake idle node becomes due
            nxt = self._due(now)[3]
        nxt = None if nxt == np.inf else float(nxt)
        gen = self.view.gen if any_due else None
        self._last_step = None if p.suspend or p.resume else (key, gen, nxt)
        return [ids[i] for i in p.suspend], [ids[i] for i in p.resume], nxt

    def _due(self, now: float) -> tuple[np.ndarray, bool, bool, float]:
        """(nodes due to sleep, any asleep, any due, when the next awake idle node becomes
        due or inf): one compiled pass over the nodes (``fast.power_due``)."""
        return K.power_due(
            now,
            self._idle_since,
            self._suspended,
            self._resuming,
            power.empty_nodes(self.view),
            self.cfg.suspend_after_s,
        )

    def _power_plan(self, idle: np.ndarray, due: np.ndarray) -> power.PowerPlan:
        """``power.plan`` for the blocked jobs still queued: green jobs' demand first wakes
        the greenest nodes, the rest the fastest.

        Memoised while it decides nothing: the same blocked jobs still queued (a blocked
        job leaves the queue only by starting: ``_blocked_starts``), power states,
        reservations and nodes due to sleep give the same empty plan. Which nodes to wake
        reads only static fits and power states; free resources (``view.gen``) matter only
        through the warm reserve when some node is due to sleep, and how long a due node has
        idled only orders a plan that suspends something."""
        reserve_reads_view = due.any() and self.cfg.warm_reserve_frac > 0
        key = (
            self.view.gen if reserve_reads_view else None,
            self._blocked_starts,
            self._blocked_ver,
            self._reserved,
            self._suspended.tobytes(),
            self._resuming.tobytes(),
            due.tobytes(),
        )
        if key == self._plan_key:
            return power.PowerPlan((), ())
        green = self._demand("green")
        early: tuple[int, ...] = ()
        suspended, resuming = self._suspended, self._resuming

        def plan(jobs, prefer) -> power.PowerPlan:
            return power.plan(
                self.view,
                idle_s=idle,
                suspended=suspended,
                resuming=resuming,
                blocked=jobs,
                reserved=self._reserved,
                cfg=self.cfg,
                prefer=prefer,
            )

        demand = "in_order"
        if green.groups and suspended.any():
            # green jobs first wake the greenest nodes; the plan below then sees those nodes
            # booting (green jobs listed first claim them) and decides the rest as usual
            early = plan(green, self._green_wake_order).resume
            if early:
                suspended, resuming = suspended.copy(), resuming.copy()
                suspended[list(early)] = False
                resuming[list(early)] = True
            demand = "green_first"
        p = plan(self._demand(demand), self._wake_order)
        p = power.PowerPlan(p.suspend, early + p.resume)
        self._plan_key = key if not p.suspend and not p.resume else None
        return p

    def _demand(self, which: str) -> power.Demand:
        """The blocked jobs still queued as a ``power.Demand``: "green" (the green ones),
        "green_first" or "in_order". Each is built when first asked for and kept until the
        blocked jobs change: a blocked job leaves the queue only by starting
        (``_blocked_starts``), and the list is new when ``_blocked_ver`` moves."""
        key = (self._blocked_ver, self._blocked_starts)
        if self._demand_key != key:
            self._demand_key = key
            self._demands = {}
        hit = self._demands.get(which)
        if hit is None:
            left = ~self._blocked_gone
            shape, green = self._blocked_shape, self._blocked_green
            if which == "green":
                ids = shape[left & green]
            elif which == "green_first":
                ids = np.concatenate([shape[left & green], shape[left & ~green]])
            else:
                ids = shape[left]
            specs = self.queue.shapes()[2]
            hit = power.Demand.of_shapes(ids, specs, self.cfg.power_demand_cap)
            self._demands[which] = hit
        return hit

    def _green_col(self) -> np.ndarray:
        """float[len(queue), 1]: 1.0 for a green job (``scores.is_green``), by queue row."""
        return self.queue.column("green", 1, (self.cfg,))

    def power_resumed(self, node_id: str, now: float) -> None:
        i = self.view.index[node_id]
        self._resuming[i] = False
        self._idle_since[i] = now
        self._last_step = None  # its power state and idle time changed: decide afresh
        self.view.set_cordoned(node_id, False)
