"""``tiresias``: discretised two-dimensional least-attained-service (Gu et al., NSDI'19), with
its preemption; ``tiresias-np`` is the same order without preemption.

What the paper does and this module does too:

- **2D attained service**: GPUs x time a job has held them, summed over its attempts (the
  running attempt counts up to now).
- **Discretised queues**: a job is in queue k when its attained service lies between the k-th
  and (k+1)-th threshold. Lower queues go first, FIFO (by arrival) inside a queue. The
  thresholds are ours: ``QUEUE_BOUNDARIES_GPU_S`` = two queues split at 3,200 GPU-seconds
  (the paper tunes its thresholds to its trace and reports that few queues suffice; these
  were not tuned on ours, and are a constructor option).
- **STARVELIMIT**: a waiting job whose wait since it last stopped exceeds ``STARVE_FACTOR`` x
  the time it has executed (all its attempts; the paper's knob scales the limit by the job's
  execution time, its value 2 here is ours) is promoted to the top queue; its service count
  restarts there (it is not demoted again by the service it had already attained).
- **Preemption**: a waiting job that cannot start while jobs of a lower-priority queue run
  has the lowest-priority running jobs (highest queue, latest arrival first) checkpointed to
  make room: on the node where that frees its GPUs with the fewest GPUs preempted (a job wider
  than a node: across nodes). Moves go through the engine's shared mechanism
  (``libs.sim.moves``): every policy pays the same checkpoint cost (``--set
  preempt.checkpoint_cost_s=...``), the job keeps its progress and is queued again. A running
  job is demoted when its service crosses a threshold, which is what makes it preemptible.

Where it differs, and why:

- Only jobs the trace marks checkpointable (or elastic) are preempted: the engine refuses any
  other move, for every policy alike. Tiresias assumes every job can be.
- Placement: a job that fits one node goes to the first node that holds it (consolidated);
  a wider one takes whole free nodes in order. The paper consolidates only the jobs its
  profiler finds skewed (the others may spread); without a skew profile every job is
  consolidated, the paper's choice for the models that need it.
- The queues are re-examined at every event and at the instants they change while jobs wait
  (a running job demoted, a waiting one promoted; the paper's scheduler looks on events and
  at a fixed interval); no new victim is chosen while a checkpoint is under way (with a zero
  cost, none is ever under way at a decision).
- A request for a fraction of a GPU never preempts (the paper has none).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection

import numpy as np

from libs.sim.baselines.base import BasePolicy, checkpointing, first_fit_scan, movable
from libs.sim.baselines.tiresias_queues import TiresiasQueues
from libs.sim.cluster import EPS, SimCluster
from libs.sim.moves import SimMove
from libs.sim.state import PENDING, Assignment, SimContext, SimJob

QUEUE_BOUNDARIES_GPU_S: tuple[float, ...] = (3200.0,)
STARVE_FACTOR = 2.0  # STARVELIMIT: promoted after waiting this many times its executed time
LOOK_AFTER_S = 1e-3  # a change is looked at this long after it (past float rounding)


class Tiresias(BasePolicy):
    name = "tiresias"

    def __init__(
        self,
        boundaries_gpu_s: tuple[float, ...] = QUEUE_BOUNDARIES_GPU_S,
        *,
        preemptive: bool = True,
        starve_factor: float = STARVE_FACTOR,
    ):
        if list(boundaries_gpu_s) != sorted(boundaries_gpu_s) or any(
            not b > 0 for b in boundaries_gpu_s
        ):
            raise ValueError(f"boundaries_gpu_s must be positive and ascending: {boundaries_gpu_s}")
        if not starve_factor > 0:
            raise ValueError(f"starve_factor must be > 0, got {starve_factor}")
        self.boundaries = boundaries_gpu_s
        self.starve_factor = starve_factor
        self.preemptive = preemptive
        if not preemptive:
            self.name = "tiresias-np"
            self.move_step = None  # type: ignore[assignment]
            self.next_move_s = None  # type: ignore[assignment]

    def attach(self, ctx: SimContext) -> None:
        super().attach(ctx)
        self.running: dict[int, SimJob] = {}
        self.pending: dict[int, SimJob] = {}
        self.service_base_gpu_s: dict[int, float] = {}  # service at its last promotion
        self.queues = TiresiasQueues(self.boundaries, self.starve_factor)  # kept per event
        nodes = ctx.cluster.nodes if ctx.cluster is not None else ()
        self._node_pos = {n.id: i for i, n in enumerate(nodes)}
        # running job idx -> (whole GPUs only, GPUs held per node position): fixed per attempt
        self._held: dict[int, tuple[bool, dict[int, int]]] = {}
        self._movable: dict[int, SimJob] = {}  # running jobs the engine lets us preempt
        self._ordered: set[int] = set()  # jobs we ordered to checkpoint (the only ones that can)

    # ----- the definition: a job's service and queue ----------------------------------------
    def service_gpu_s(self, job: SimJob, now: float) -> float:
        """Attained GPU-seconds since the job's last promotion (the running attempt included)."""
        s = job.attained_gpu_s - self.service_base_gpu_s.get(job.idx, 0.0)
        if job.idx in self.running and not checkpointing(job):
            s += job.spec.gpus * (now - job.start_s)
        return s

    def queue_of(self, job: SimJob, now: float) -> int:
        """0 is the highest-priority queue. A starving waiting job is promoted to it."""
        waited_s = now - job.enqueue_s
        if job.state == PENDING and job.run_s > 0 and waited_s > self.starve_factor * job.run_s:
            self.service_base_gpu_s[job.idx] = job.attained_gpu_s
        served = self.service_gpu_s(job, now)
        return sum(served >= b - EPS for b in self.boundaries)

    def key(self, job: SimJob, now: float) -> tuple:
        return (self.queue_of(job, now), job.submit_s, job.idx)

    # ----- engine hooks ---------------------------------------------------------------------
    def enqueued(self, job: SimJob, now: float) -> None:
        self.pending[job.idx] = job
        self.queues.add(job, job.attained_gpu_s - self.service_base_gpu_s.get(job.idx, 0.0))

    def started(self, job: SimJob, now: float) -> None:
        self.pending.pop(job.idx, None)
        self.queues.remove(job)
        self.running[job.idx] = job
        held: dict[int, int] = {}
        for a in job.allocs:
            n = self._node_pos[a.node]
            held[n] = held.get(n, 0) + len(a.gpu_indices)
        self._held[job.idx] = (all(a.gpu_share >= 1.0 - EPS for a in job.allocs), held)
        if movable(job):
            self._movable[job.idx] = job
        self.queues.started(job, self.service_gpu_s(job, now), now)

    def ended(self, job: SimJob, now: float) -> None:
        self.running.pop(job.idx, None)
        self._held.pop(job.idx, None)
        self._movable.pop(job.idx, None)
        self._ordered.discard(job.idx)

    def _promote(self, now: float) -> None:
        """STARVELIMIT: the waiting jobs due at ``now`` restart their service count (what
        ``queue_of`` does for each waiting job it is asked about; ``queues`` moved them)."""
        for job in self.queues.promote_due(now):
            self.service_base_gpu_s[job.idx] = job.attained_gpu_s

    def schedule(
        self, queue: Collection[SimJob], view: SimCluster, running: Collection[SimJob], now: float
    ) -> list[Assignment]:
        self._promote(now)  # then the kept order is sorted(queue, key=self.key)
        return first_fit_scan(self.queues.in_order(), view, check_memory=True, blocking=False)

    def next_move_s(self, now: float) -> float | None:
        """The next instant the queues change without an event while jobs wait: a running
        job's service crossing a boundary (it is demoted) or a waiting job reaching
        STARVELIMIT (it is promoted). Both come from heaps kept per event
        (``tiresias_queues``), not from a scan of every job."""
        if not self.pending:
            return None

        def exact(idx: int, token: int, b: float) -> float | None:
            j = self.running.get(idx)
            if j is None or j.token != token or checkpointing(j):
                return None
            served = self.service_gpu_s(j, now)
            return now + (b - served) / j.spec.gpus if b > served + EPS else None

        soon = min(self.queues.next_demotion_s(exact), self.queues.next_promotion_s(now))
        return soon + LOOK_AFTER_S if soon < math.inf else None

    # ----- preemption -----------------------------------------------------------------------
    def move_step(self, now: float) -> list[SimMove]:
        """Checkpoint orders: lower-queue running jobs that make room for waiting jobs of a
        higher-priority queue (the waiting jobs in queue order, each planned once)."""
        if not self.pending or any(checkpointing(self.running[i]) for i in self._ordered):
            return []  # only a job we ordered can be checkpointing (libs.sim.moves)
        victims = list(self._movable.values())
        if not victims:
            return []
        self._promote(now)
        head = next(self.queues.in_order(), None)
        top = len(self.boundaries)  # the lowest-priority queue
        if head is None or self.queues.queue_of[head.idx] >= top:
            return []  # no running job is in a lower queue than the first waiting one
        lowest = 0
        for j in victims:  # the lowest queue any victim is in, stopping at the lowest there is
            lowest = max(lowest, self.queue_of(j, now))
            if lowest >= top:
                break
        if self.queues.queue_of[head.idx] >= lowest:
            return []  # the first waiting job would stop the scan below at once
        vq = {j.idx: self.queue_of(j, now) for j in victims}
        cluster: SimCluster = self.ctx.cluster  # type: ignore[assignment]
        free = cluster.free_whole().astype(float)
        ranked = sorted(victims, key=lambda j: (-vq[j.idx], -j.submit_s, -j.idx))
        by_node: dict[int, list[tuple[SimJob, int]]] = {}  # node -> victims there, ranked
        for v in ranked:
            whole, on = self._held[v.idx]
            if whole:
                for n, gpus in on.items():
                    if gpus:
                        by_node.setdefault(n, []).append((v, gpus))
        taken: set[int] = set()
        failed: set[tuple] = set()
        orders: list[SimMove] = []
        for job in self.queues.in_order():
            q = self.queues.queue_of[job.idx]
            if q >= lowest:
                break  # every later waiting job is in this queue or a lower one
            if job.spec.gpus < 1.0:
                continue
            shape = (job.spec.gpus, job.spec.gpu_mem_gb, job.spec.constraints, q)
            if shape in failed:
                continue
            plan = self._plan(
                job,
                lambda v, q=q: vq[v.idx] > q and v.idx not in taken,
                ranked,
                by_node,
                free,
                cluster,
                self._held,
            )
            if plan is None:
                failed.add(shape)
                continue
            for v in plan:
                taken.add(v.idx)
                self._ordered.add(v.idx)
                reason = f"tiresias: queue {vq[v.idx]} yields to {job.spec.id} (queue {q})"
                orders.append((v, "preempt", reason, 0))
        return orders

    @staticmethod
    def _plan(
        job: SimJob,
        eligible: Callable[[SimJob], bool],
        ranked: list[SimJob],
        by_node: dict[int, list[tuple[SimJob, int]]],
        free: np.ndarray,
        cluster: SimCluster,
        held: dict[int, tuple[bool, dict[int, int]]],
    ) -> list[SimJob] | None:
        """The victims (a prefix of the eligible ones per node, lowest priority first) that
        free room for ``job``, charged to ``free``; None when it cannot start or needs no one.
        ``ranked``: the running movable jobs, lowest priority first; ``by_node``: the same
        order per node position, with the GPUs each holds there; ``held``: each one's (whole
        GPUs only, GPUs per node). A job holding a share of a GPU is never a victim."""
        s = job.spec
        need = float(round(s.gpus))
        ok = cluster.model_mask(s.constraints) & (cluster.gpu_mem_gb >= s.gpu_mem_gb - EPS)
        if not ok.any():
            return None
        if need <= int(cluster.gpu_count[ok].max()):
            fits = ok & (cluster.gpu_count >= need)
            if (free[fits] >= need).any():
                return None  # room already (the pass could not use it: host memory or CPUs)
            best: tuple[float, int, list[SimJob]] | None = None
            for n in np.flatnonzero(fits).tolist():
                there = by_node.get(n)
                if not there:
                    continue  # nothing to free here: free[n] < need already
                got = free[n]
                chosen: list[SimJob] = []
                for v, gpus in there:
                    if not eligible(v):
                        continue
                    chosen.append(v)
                    got += gpus
                    if got >= need:
                        break
                if got >= need and (best is None or got - free[n] < best[0]):
                    best = (got - free[n], n, chosen)
            if best is None:
                return None
            _, n, chosen = best
            free[n] += best[0] - need
            return chosen
        got = float(free[ok].sum())  # a gang wider than a node: GPUs anywhere it may run
        if got >= need:
            return None
        chosen = []
        for v in ranked:
            if not eligible(v):
                continue
            whole, on = held[v.idx]
            gpus = sum(g for n, g in on.items() if ok[n])
            if gpus and whole:
                chosen.append(v)
                got += gpus
                if got >= need:
                    break
        if got < need:
            return None
        for n in np.flatnonzero(ok).tolist():  # the gang takes the free GPUs it counted
            free[n] = 0.0
        return chosen
