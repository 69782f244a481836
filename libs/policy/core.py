"""The one scheduler both drivers feed: events in, decisions out (DESIGN rule 1).

The simulator (``libs.sim.baselines.mosaic``) feeds it trace events; the live placer
(``services.placer``) feeds it what it folds from NATS and commits what it decides to the ledger.
Neither keeps policy state of its own: the queue (with its rank epochs), the running set (for
reservations), tenant usage (for DRF), the backfill cadence, the power states and the last
reason of each waiting job all live here, so the same events give the same placements and
power decisions whichever driver feeds them. No I/O, no wall clock, no globals.

Events: ``queue_job``, ``cancel_job``, ``start_job``, ``end_job``, ``set_cordoned`` (named
holds), ``set_temp``, ``node_resumed``, ``power_fact``. Decisions: ``schedule_pass`` (rank,
filter, score, pick, reserve/backfill: ``libs.policy.scheduler``), ``preempt_step`` (moves,
``core_moves``), ``power_step``, or all at once with ``tick``. Explanations: ``reason_of``,
``reasons``, ``explain``.

A pass's placements are started in the scheduler at once: the pass updates the view in place
and ``schedule_pass`` books each one as ``start_job`` would (out of the queue, into the running
set, the move book, tenant usage, the power stage's demand). The driver then confirms each
with ``start_job`` (the simulator when its engine starts the job, the placer after its ledger
commit) or gives it back with ``unplace`` (a commit that failed). Why at once: the two drivers
report starts at different moments of the same instant (the engine before the instant's moves
and power step, the placer only after its whole ``tick``), and every stage after the pass
reads what is running; booked by the pass, the moves and the power step see the same state
whichever driver feeds them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from libs.policy import backfill as B
from libs.policy import filters as F
from libs.policy import scheduler
from libs.policy.cadence import BackfillCadence
from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.core_moves import MovesMixin
from libs.policy.core_power import PowerMixin
from libs.policy.core_scale import ScaleMixin
from libs.policy.could_place import could_place
from libs.policy.daynight import DayNight
from libs.policy.decisions import Decisions, MoveOrder, Place
from libs.policy.fast.protected import ProtectedWaits
from libs.policy.gang_pass import allocation_of, part_id, part_jobs
from libs.policy.moves import MoveBook
from libs.policy.power_state import PowerState
from libs.policy.priority import regime
from libs.policy.profiles import ProfileTable
from libs.policy.queue import PendingQueue
from libs.policy.reasons import WaitReasons
from libs.policy.scaling import Autoscaler
from libs.policy.scores import is_green
from libs.policy.stages.heat import HeatMemory
from libs.policy.types import CycleResult, PendingJob, RunningJob
from libs.policy.usage import usage_of
from libs.policy.wait_info import explain_wait
from libs.policy.wakeups import Wakeups
from proto.decisions import WaitNumbers
from proto.intents import HOLD_HOT
from proto.jobs import HIGH_PRIORITY, JobSpec
from proto.ledger import Allocation, node_allocations
from proto.nodes import NodeSpec


class Scheduler(MovesMixin, PowerMixin, ScaleMixin):
    """One cluster's scheduling state and decisions (see the module docstring)."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        *,
        cfg: PolicyConfig,
        profiles: ProfileTable,
        now: float = 0.0,
    ) -> None:
        """``now``: when the scheduler starts; every node counts as idle since then (so a
        placer that starts does not suspend every node at once)."""
        self.cfg = cfg
        self.profiles = profiles.covering(nodes)
        self.view = ClusterView.build(nodes)
        self.queue = PendingQueue()
        self.running = B.RunningSet()  # kept across passes, as the pass asks
        self.usage: dict[str, np.ndarray] = {}  # per tenant, RESOURCES order
        self._held: dict[str, tuple[Allocation, np.ndarray, str]] = {}  # alloc, usage, tenant
        # started by a pass, not yet confirmed by the driver: (job, node, GPUs) -> the job
        self._applied: dict[tuple, PendingJob] = {}
        self._never = F.NeverFits(self.view.nodes)  # could some node ever hold a request shape
        self._holds: dict[str, set[str]] = {}  # node -> why it is cordoned (operator, down...)
        self._cadence = BackfillCadence(cfg.backfill_interval_s)
        self._tick_at: float | None = None
        self.power = PowerState(self.view, cfg, self.profiles, now)
        self.why = WaitReasons(self.queue, self.view, lambda: self.power.resuming)
        self._asks: dict[tuple[float, float], int] = {}  # (GPUs, GPU memory) -> jobs queued
        self.wakeups = Wakeups()  # the instants a driver owes the scheduler (see tick)
        self.last: CycleResult | None = None
        self._preempt_due_s = now  # the priority-protection rule looks again from then
        # queued jobs the priority-protection rule protects, by wait (its per-instant questions)
        self.protected = ProtectedWaits(cfg.preempt.protect_priority)
        self.boot_waits = ProtectedWaits(cfg.preempt.boot_priority)  # (stages.boot)
        self._boot_due_s = now  # the boot-protection rule looks again from then
        self.regime = regime(0.0, cfg)
        # running attempts' history, ordered moves (stages.preempt)
        self.moves = MoveBook(len(self.view.node_ids))
        self.heat = HeatMemory(self.view.nodes, cfg)  # which nodes ran hot (stages.heat)
        self._hot: set[int] = set()  # nodes the thermal guard holds now
        self.view.heat_risky = self.heat.labelled.copy()
        self._heat_watch = False  # some node ran hot: note the heat every pass
        # day/night (libs.policy.daynight): the pass and the power stage use the config in
        # force at their ``now``; self.cfg stays the configured one (moves, green, heat)
        self.daynight = DayNight(cfg)
        self.period = ""  # the period of the last pass ("" with the calendar off)
        self.scaler = Autoscaler()  # inference services and their replicas (core_scale)

    def use_profiles(self, profiles: ProfileTable) -> None:
        """The newest profile table (the profiler's learning): later passes rank, place and
        estimate ends with it; running jobs keep the end estimated when they started."""
        self.profiles = profiles.covering(self.view.nodes)
        self.power.use_profiles(self.view, self.profiles)
        self.queue.rank_epoch = None  # the epoch's scores came from the old table

    # ----- events: jobs --------------------------------------------------------------------
    def can_ever_place(self, spec: JobSpec) -> bool:
        """Whether some node of the cluster (or, for a gang, some nodes of one model together)
        could hold ``spec`` even empty (per shape)."""
        return self._never(spec) is None

    def queue_job(self, job: PendingJob) -> None:
        """A job waits to start (a submission, a retry, a preempted job back in line)."""
        self.queue.add(job)
        self.protected.add(job)
        self.boot_waits.add(job)
        key = (job.spec.gpus, job.spec.gpu_mem_gb)
        self._asks[key] = self._asks.get(key, 0) + 1
        self.why.queued(job.spec.id)
        self.scaler.queued(job.spec)
        # scores.is_green per queued job (fixed per spec), a column that moves with its row
        self._green_col()[self.queue.position(job.spec.id), 0] = is_green(job.spec, self.cfg)

    def cancel_job(self, job_id: str, now: float) -> None:
        """The job left: cancelled or failed while pending, or ended while running."""
        if job_id in self.queue:
            self.scaler.gone(job_id)
            self._dequeue(job_id)
        elif job_id in self._held:
            self.end_job(job_id, now)
        self.moves.forget(job_id)
        self._release_room(job_id)

    def start_job(self, job_id: str, alloc: Allocation, spec: JobSpec, now: float) -> None:
        """The job runs with ``alloc``: one this scheduler placed (a confirmation: the pass
        booked it already, see the module docstring) or one the driver found running."""
        key = (alloc.job_id, alloc.node, alloc.gpu_indices)
        if self._applied.pop(key, None) is not None:
            return
        self.view.allocate(alloc)
        for a in node_allocations(alloc):
            self.power.node_taken(self.view.index[a.node])
        self._book_start(job_id, alloc, spec)

    def _book_start(self, job_id: str, alloc: Allocation, spec: JobSpec) -> None:
        """What a start changes, its allocation already on the view. Expected end: the
        allocation's time plus the profile's runtime on that GPU model (what a live placer
        can know, not the simulator's truth)."""
        if job_id in self.queue:
            self._dequeue(job_id)
        self._release_room(job_id)
        i = self.view.index[alloc.node]
        # the warm reserve's demand (libs.policy.warm): every start, whoever placed it, on
        # each node it holds (a gang's parts too)
        for a in node_allocations(alloc):
            gpus = len(a.gpu_indices) * a.gpu_share
            self.power.started(
                self.view.index[a.node], gpus, spec.priority >= HIGH_PRIORITY, a.time
            )
        vec = usage_of(alloc)
        self.scaler.started(spec)
        self._held[job_id] = (alloc, vec, spec.tenant)
        cur = self.usage.get(spec.tenant)
        self.usage[spec.tenant] = vec.copy() if cur is None else cur + vec
        model = self.view.nodes[i].gpu_model
        est_end = alloc.time + self.profiles.runtime_s(spec, model)
        if alloc.parts:  # a gang: one entry per node; never moved (stages.preempt), not booked
            for rj in part_jobs(alloc, spec, self.view, est_end):
                self.running.add(rj)
            return
        rj = RunningJob(spec, i, alloc.gpu_indices, alloc.gpu_share, est_end)
        self.running.add(rj)
        self.moves.started(rj, alloc.attempt, alloc.node, alloc.time)

    def end_job(self, job_id: str, now: float) -> MoveOrder | None:
        """The attempt stopped (completed, failed, preempted, killed): free what it held; the
        move that stopped it, if one did (the driver requeues it with ``moved_job``)."""
        alloc, vec, tenant = self._held.pop(job_id)
        self.scaler.gone(job_id)
        self._applied.pop((alloc.job_id, alloc.node, alloc.gpu_indices), None)
        self.view.release(alloc)
        for a in node_allocations(alloc):
            i = self.view.index[a.node]
            if self.view.whole_free[i] >= self.view.gpu_total[i]:
                self.power.node_emptied(i, now)
            self.running.remove(part_id(job_id, a.node) if alloc.parts else job_id)
        self.usage[tenant] = np.maximum(self.usage[tenant] - vec, 0.0)
        return self.moves.ended(job_id, self.view.index[alloc.node])

    def _dequeue(self, job_id: str) -> None:
        """The job leaves the queue (started or cancelled): out of every record of the queue."""
        self.power.left_queue(self.queue.seq()[self.queue.position(job_id)])
        self.protected.remove(job_id)
        self.boot_waits.remove(job_id)
        spec = self.queue.remove(job_id).spec
        key = (spec.gpus, spec.gpu_mem_gb)
        n = self._asks[key] - 1
        if n:
            self._asks[key] = n
        else:
            del self._asks[key]
        self.why.forget(job_id)
        self.heat.forget(job_id)

    def unplace(self, alloc: Allocation, now: float) -> None:
        """A placement of the last pass that the driver could not commit (the ledger holds
        another, or the lease was lost): its start is undone and the job waits again, as a new
        queue entry (the placer then takes what the ledger holds, or rebuilds on takeover)."""
        job = self._applied.get((alloc.job_id, alloc.node, alloc.gpu_indices))
        if job is None:
            return
        self.end_job(alloc.job_id, now)
        self.queue_job(job)

    def holds(self, job_id: str) -> Allocation | None:
        entry = self._held.get(job_id)
        return entry[0] if entry is not None else None

    # ----- events: nodes -------------------------------------------------------------------
    def set_cordoned(self, node_id: str, why: str, on: bool) -> None:
        """Hold ``node_id`` out of placement for ``why`` (an operator cordon, a node that went
        silent, power) or release that hold; the node is cordoned while any hold remains."""
        holds = self._holds.setdefault(node_id, set())
        before = bool(holds)
        holds.add(why) if on else holds.discard(why)
        if why == HOLD_HOT and node_id in self.view.index:  # placement remembers (stages.heat)
            i = self.view.index[node_id]
            self._hot.add(i) if on else self._hot.discard(i)
        if bool(holds) != before:
            self.view.set_cordoned(node_id, bool(holds))

    def cordoned(self, why: str) -> set[str]:
        return {n for n, h in self._holds.items() if why in h}

    def set_temp(self, node_id: str, temp_c: float) -> None:
        if node_id in self.view.index and self.view.temp_c[self.view.index[node_id]] != temp_c:
            self.view.set_temp(node_id, temp_c)

    # ----- decisions -----------------------------------------------------------------------
    def schedule_pass(self, now: float) -> list[Place]:
        """One pass: what starts now. Backfill below a blocked head on the cadence
        (``PolicyConfig.backfill_interval_s``); the blocked jobs of a backfill pass become the
        power stage's demand."""
        full = self._cadence.take(now)
        cfg = self._policy_at(now)
        if self._hot or self._heat_watch:  # some node runs or ran hot: stages.heat
            busy = self.view.whole_free < self.view.gpu_total  # (a fraction: not whole)
            self.view.heat_risky = self.heat.note(list(self._hot), busy, now, self.cfg)
            self._heat_watch = bool(self.heat.learnt.any())
        res = scheduler.schedule(
            self.queue,
            self.view,
            self.running,
            now=now,
            tenant_usage=self.usage,
            profiles=self.profiles,
            cfg=cfg,
            reasons=False,
            backfill=full,
            walked_limit=self.cfg.power_demand_cap,  # all the resume decision reads
            heat_memory=self.heat,
            high_hold=self.power.high_hold(now) if cfg.power_saving else None,
        )
        self.last = res
        self.regime = res.regime
        # a pass that did not backfill and left jobs waiting: pass again when backfill is due
        waiting = len(self.queue) > len(res.assignments)
        self._tick_at = self._cadence.next_s if waiting and not full else None
        if waiting and self.period:  # a pass at the next day/night switch, events or not
            switch = self.daynight.next_switch_s(now)
            self._tick_at = switch if self._tick_at is None else min(self._tick_at, switch)
        if self.cfg.power_saving and full:
            self.power.note_blocked(res, self.queue, lambda: self._green_col()[:, 0])
        self.why.note(res, full)
        out: list[Place] = []
        rooms = self._fill_rooms(res, now)
        for pj, placement in [*res.assignments, *rooms]:
            alloc, _ = allocation_of(pj.spec, placement, now, pj.attempt)  # a gang: one record
            self._applied[(alloc.job_id, alloc.node, alloc.gpu_indices)] = pj
            self._book_start(pj.spec.id, alloc, pj.spec)  # started now (module docstring)
            out.append(Place(pj, placement, alloc))
        if self.view.heat_risky.any():  # stages.heat: a pass when a job kept off may take one
            heat_s = self.heat.note_waits(res.waiting, now, self.queue.get, self.cfg)
            if heat_s is not None:
                self._tick_at = heat_s if self._tick_at is None else min(self._tick_at, heat_s)
        return out

    def _policy_at(self, now: float) -> PolicyConfig:
        """The config in force at ``now`` (``daynight.effective_policy``); a new period is
        handed to the power stage (its warm reserve keeps the inference headroom awake)."""
        cfg, self.period = self.daynight.at(now)
        if cfg is not self.power.cfg:
            self.power.use_policy(cfg)
        return cfg

    def next_pass_s(self) -> float | None:
        """When a pass is due without an event (the next backfill), or None."""
        return self._tick_at

    def could_place_now(self) -> bool:
        """Could any queued request fit somewhere now (``could_place.could_place``)?"""
        return could_place(self._asks, self.view)

    def tick(self, now: float, *, woke: bool = True) -> Decisions:
        """One instant, as the simulator's engine runs one: the pass when something happened
        that may let a job start (``woke``: an arrival, an end, a node awake, a hold released)
        or a backfill instant is due, and something could fit; then the power stage. The
        instants the driver owes the scheduler next are in ``wakeups`` (``next_tick_s``)."""
        woke = self.wakeups.due(now) or woke
        places: list[Place] = []
        moves: list[MoveOrder] = []
        passed = False
        if woke and self.could_place_now():
            places = self.schedule_pass(now)
            passed = True
            self.wakeups.after_pass(now, self._tick_at)
        # at every instant, woken or not (a full cluster places nothing, and is where priority
        # protection matters): both drivers give the scheduler the same instants, not always
        # the same reasons to wake
        moves = self.preempt_step(now)
        self.wakeups.after_pass(now, self.next_move_s(now))
        step = self.power_step(now)
        self.wakeups.after_power(now, step.next_s)
        self.wakeups.after_scale(now, self.scale_next_s())
        ids = self.view.node_ids
        return Decisions(
            places=places,
            moves=tuple(moves),
            suspend=tuple(ids[i] for i in step.suspend),
            wake=tuple(ids[i] for i in step.resume),
            warm=tuple(ids[i] for i in step.warm),
            next_tick_s=self.wakeups.next_s(),
            passed=passed,
            regime=self.regime,
        )

    # ----- reasons (libs.policy.reasons) ---------------------------------------------------
    def reason_of(self, job_id: str) -> str:
        """Why a queued job waits (``decisions.WAIT_REASONS`` or a filter's refusal code)."""
        return self.why.of(job_id)

    def reasons(self) -> dict[str, str]:
        """Every queued job's reason (jobs never tried wait on Priority)."""
        return self.why.all()

    def reason_changes(self, limit: int) -> dict[str, str]:
        """Up to ``limit`` queued jobs whose reason changed since last asked (see
        ``reasons.WaitReasons.changes``)."""
        return self.why.changes(limit)

    def explain(self, job_id: str, now: float) -> WaitNumbers | None:
        """A queued job's wait with numbers (rank, score terms, best node, reservation)."""
        job = self.queue.get(job_id)
        if job is None:
            return None
        return explain_wait(self, job, now)

    def _green_col(self) -> np.ndarray:
        """float[len(queue), 1]: 1.0 for a green job (``scores.is_green``), by queue row."""
        return self.queue.column("green", 1, (self.cfg,))

    # ----- for drivers that rebuild --------------------------------------------------------
    def running_allocations(self) -> Iterable[Allocation]:
        return (a for a, _, _ in self._held.values())
