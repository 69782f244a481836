"""``gavel``: Gavel's round-based scheduling (Narayanan et al., OSDI'20) over an allocation
computed by one of its policies (``libs.sim.baselines.gavel_lp``).

Names: ``gavel`` (= ``gavel-las``): heterogeneity-aware max-min fairness over effective
throughput, Gavel's ``max_min_fairness_perf`` and its LAS; ``las``: the same mechanism with the
heterogeneity-agnostic allocation (``max_min_fairness``: every GPU type alike), the published
comparison (Gavel reports about 1.4x lower average JCT for the aware one); ``gavel-fifo``:
heterogeneity-aware FIFO. Each has a ``-np`` variant: no preemption.

The mechanism, as the paper's section 5 describes it:

- Time is cut into rounds of ``ROUND_S`` (360 s, Gavel's simulator setting). At each round
  boundary the allocation X is recomputed when the set of active jobs (waiting or running)
  changed, else reused.
- Each (job, type) pair gets the priority X[job, type] / (share of the job's time in the
  system that it has spent on that type); a pair never served has infinite priority (ties by
  X). Pairs are taken in priority order; a job is scheduled on the first type of its pairs
  with enough GPUs left this round (a type's GPUs counted as a whole, as Gavel's workers).
- A running job scheduled on its current type keeps its GPUs; a running job not scheduled,
  or scheduled on another type, is preempted through the engine's shared mechanism
  (``libs.sim.moves``: checkpoint cost ``--set preempt.checkpoint_cost_s``, Gavel's own
  simulator uses 0; the job keeps its progress). A scheduled waiting job starts on the first
  nodes of its type that hold it.
- Jobs arriving inside a round wait for the next one, and GPUs freed by a job that ends inside
  a round stay idle until it ends (as in Gavel's simulator).

Where it differs, and why:

- Only checkpointable (or elastic) jobs are preempted: the engine refuses any other move, for
  every policy alike. Gavel assumes every job is. A running job that may not be moved is
  scheduled first, on its type, for as long as it runs.
- Pairs with X = 0 are offered the GPUs left after every positive pair (fastest type first),
  so the LP's choice of optimum never leaves a GPU idle that a waiting job could use.
- No space sharing (Gavel's packing variant), no priority weights, no placement across types.
  A gang that no single type can hold is never scheduled.
- ``-np``: rounds still decide which waiting jobs start, but a running job is never stopped
  (every running job is scheduled first, on its type).
"""

from __future__ import annotations

import math
from collections.abc import Collection

import numpy as np

from libs.sim.baselines.base import BasePolicy, checkpointing, movable
from libs.sim.baselines.gavel_lp import fifo_allocation, max_min_allocation
from libs.sim.cluster import EPS, SimCluster
from libs.sim.moves import SimMove
from libs.sim.state import PENDING, RUNNING, Assignment, SimContext, SimJob

ROUND_S = 360.0
STUCK_ROUNDS = 3  # rounds with nothing running or started before the engine is told
KINDS = ("max_min_perf", "max_min", "fifo_perf")


class Gavel(BasePolicy):
    name = "gavel"

    def __init__(
        self, kind: str = "max_min_perf", *, preemptive: bool = True, round_s: float = ROUND_S
    ):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if not round_s > 0:
            raise ValueError(f"round_s must be > 0, got {round_s}")
        self.kind = kind
        self.preemptive = preemptive
        self.round_s = round_s
        base = {"max_min_perf": "gavel", "max_min": "las", "fifo_perf": "gavel-fifo"}[kind]
        self.name = base if preemptive else base + "-np"

    def attach(self, ctx: SimContext) -> None:
        super().attach(ctx)
        c: SimCluster = ctx.cluster  # type: ignore[assignment]
        self.type_masks = [c.model_index == m for m in range(len(c.models))]
        self.type_gpus = np.array([c.gpu_count[mask].sum() for mask in self.type_masks], float)
        self.model_pos = {m: i for i, m in enumerate(c.models)}
        self.known: dict[int, SimJob] = {}
        self.served_s: dict[int, np.ndarray] = {}  # seconds run on each type
        self.t0_s: float | None = None
        self.next_round_s = -math.inf
        self.plan: dict[int, int] = {}  # job idx -> type, this round
        self.plan_order: list[int] = []
        self.orders: list[SimMove] = []
        self._cache_key: tuple[int, ...] | None = None
        self._cache_x: dict[int, np.ndarray] = {}
        self._fifo_kept: dict[int, int] = {}
        self._feasible: dict[int, np.ndarray] = {}
        self.rounds = self.lp_solves = 0
        self._rounds_idle = 0  # rounds since a job last started

    # ----- engine hooks ---------------------------------------------------------------------
    def enqueued(self, job: SimJob, now: float) -> None:
        self.known[job.idx] = job
        self.served_s.setdefault(job.idx, np.zeros(len(self.type_gpus)))
        if self.t0_s is None:
            self.t0_s = now

    def started(self, job: SimJob, now: float) -> None:
        self._rounds_idle = 0

    def ended(self, job: SimJob, now: float) -> None:
        if job.model:
            self.served_s[job.idx][self.model_pos[job.model]] += now - job.start_s

    def schedule(
        self, queue: Collection[SimJob], view: SimCluster, running: Collection[SimJob], now: float
    ) -> list[Assignment]:
        self._maybe_round(now)
        out: list[Assignment] = []
        for i in self.plan_order:
            job, m = self.known[i], self.plan[i]
            if job.state != PENDING:
                continue
            allocs = view.first_fit(job.spec, check_memory=True, node_mask=self.type_masks[m])
            if allocs is None:
                continue  # its type's GPUs are there, but not on nodes that hold it
            for a in allocs:
                view.allocate(a, notify=False)
            out.append((job, allocs))
        for _, allocs in out:
            for a in allocs:
                view.release(a, notify=False)
        return out

    def move_step(self, now: float) -> list[SimMove]:
        self._maybe_round(now)
        orders, self.orders = self.orders, []
        return [o for o in orders if o[0].state == RUNNING and not checkpointing(o[0])]

    def next_move_s(self, now: float) -> float | None:
        """The next round boundary while jobs are active. None when nothing runs and rounds
        have started nothing for a while: the engine then reports the jobs it cannot place
        (``StuckSimulation``) instead of ticking forever."""
        running = any(j.state == RUNNING for j in self.known.values())
        live = running or any(j.state == PENDING for j in self.known.values())
        if not running and self._rounds_idle > STUCK_ROUNDS:
            return None
        return self.next_round_s if live and self.next_round_s > now else None

    # ----- rounds ---------------------------------------------------------------------------
    def _maybe_round(self, now: float) -> None:
        if now < self.next_round_s - EPS or self.t0_s is None:
            return
        k = math.floor((now - self.t0_s) / self.round_s + EPS)
        self.next_round_s = self.t0_s + (k + 1) * self.round_s
        self.known = {i: j for i, j in self.known.items() if j.state in (PENDING, RUNNING)}
        self.rounds += 1
        self._rounds_idle += 1
        self._new_round(now)

    def _new_round(self, now: float) -> None:
        jobs = sorted(self.known.values(), key=lambda j: (j.submit_s, j.idx))
        x = self.allocation(jobs)
        free = self.type_gpus.copy()
        plan: dict[int, int] = {}
        order: list[int] = []
        for j in jobs:  # jobs that stay where they are whatever the priorities say
            stays = not self.preemptive or not movable(j)
            if j.state == RUNNING and not checkpointing(j) and stays:
                m = self.model_pos[j.model]
                plan[j.idx] = m
                free[m] -= j.spec.gpus
        cand = [
            j for j in jobs if j.idx not in plan and not (j.state == RUNNING and checkpointing(j))
        ]
        narrowest = min((j.spec.gpus for j in cand), default=0.0)
        for r, m in self._ranked_pairs(cand, x, now):
            if free.max() < narrowest - EPS:
                break  # no type has room for any job left: no later pair is taken
            j = cand[r]
            if j.idx in plan or free[m] < j.spec.gpus - EPS:
                continue
            plan[j.idx] = m
            free[m] -= j.spec.gpus
            order.append(j.idx)
        self.plan, self.plan_order = plan, order
        if self.preemptive:
            for j in jobs:
                if j.state == RUNNING and not checkpointing(j) and movable(j):
                    want = plan.get(j.idx)
                    if want != self.model_pos[j.model]:
                        why = "not scheduled" if want is None else "moved to another type"
                        self.orders.append((j, "preempt", f"gavel round: {why}", 0))

    def _ranked_pairs(
        self, cand: list[SimJob], x: dict[int, np.ndarray], now: float
    ) -> list[tuple[int, int]]:
        """(row in ``cand``, type) of every feasible pair in Gavel's priority order: X over
        the share of the job's time in the system spent on the type (never served first),
        then larger X, faster, earlier, lower idx, lower type; pairs with X = 0 after every
        positive one. One sort of arrays per round (a Python sort of tuples was most of a
        round on a queue of thousands); the keys are the same floats, the order the same."""
        if not cand:
            return []
        xs = np.array([x[j.idx] for j in cand])
        served = np.array([self.served_s[j.idx] for j in cand])
        for r, j in enumerate(cand):  # the running attempt counts on its own type
            if j.state == RUNNING and not checkpointing(j):
                served[r, self.model_pos[j.model]] += now - j.start_s
        in_system = np.array([max(now - j.submit_s, EPS) for j in cand])
        got = served / in_system[:, None]
        prio = np.full(xs.shape, np.inf)
        np.divide(xs, got, out=prio, where=got > 0)
        speed = 1.0 / np.array([j.runtime_s for j in cand], dtype=float)
        rows, types = np.nonzero(np.array([self.feasible(j) for j in cand]))
        submit = np.array([j.submit_s for j in cand])[rows]
        idx = np.array([j.idx for j in cand])[rows]
        keys = (
            types,
            idx,
            submit,
            -speed[rows, types],
            -xs[rows, types],
            -prio[rows, types],
            xs[rows, types] <= EPS,
        )
        order = np.lexsort(keys)  # the last key is the first criterion
        return list(zip(rows[order].tolist(), types[order].tolist(), strict=True))

    def served_on(self, job: SimJob, m: int, now: float) -> float:
        """Seconds ``job`` has run on type ``m``, its running attempt included."""
        s = float(self.served_s[job.idx][m])
        if job.state == RUNNING and not checkpointing(job) and self.model_pos[job.model] == m:
            s += now - job.start_s
        return s

    def can_ever_place(self, job: SimJob) -> bool:
        return bool(self.feasible(job).any())

    def feasible(self, job: SimJob) -> np.ndarray:
        """Types that could ever hold ``job`` (its constraints, memory and width)."""
        hit = self._feasible.get(job.idx)
        if hit is None:
            c: SimCluster = self.ctx.cluster  # type: ignore[assignment]
            s = job.spec
            ok = c.model_mask(s.constraints) & (c.gpu_mem_gb >= s.gpu_mem_gb - EPS)
            hit = np.array(
                [
                    bool((ok & tm).any()) and c.gpu_count[ok & tm].sum() >= s.gpus
                    for tm in self.type_masks
                ]
            )
            self._feasible[job.idx] = hit
        return hit

    def allocation(self, jobs: list[SimJob]) -> dict[int, np.ndarray]:
        """X per job idx, recomputed only when the set of active jobs changed."""
        key = tuple(j.idx for j in jobs)
        if key == self._cache_key:
            return self._cache_x
        k = len(self.type_gpus)
        thr = np.array([1.0 / j.runtime_s for j in jobs]).reshape(len(jobs), k)
        gpus = np.array([j.spec.gpus for j in jobs], dtype=float)
        feas = np.array([self.feasible(j) for j in jobs]).reshape(len(jobs), k)
        if self.kind == "fifo_perf":
            rows = {j.idx: r for r, j in enumerate(jobs)}
            kept = {rows[i]: m for i, m in self._fifo_kept.items() if i in rows}
            got = fifo_allocation(range(len(jobs)), thr, gpus, self.type_gpus, feas, kept)
            self._fifo_kept = {jobs[r].idx: m for r, m in got.items()}
            x = np.zeros((len(jobs), k))
            for r, m in got.items():
                x[r, m] = 1.0
        else:
            x, _ = max_min_allocation(
                thr, gpus, self.type_gpus, feas, aware=self.kind == "max_min_perf"
            )
            self.lp_solves += 1
        self._cache_key = key
        self._cache_x = {j.idx: x[r] for r, j in enumerate(jobs)}
        return self._cache_x
