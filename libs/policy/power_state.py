"""The power stage's memory: which nodes sleep, boot or idle since when, and which blocked jobs
the last backfill pass left behind (the demand that wakes nodes).

Why a stateful object beside the pure ``power.plan``: the plan reads how long each node idled
and which jobs are blocked, and both are facts the scheduler learns event by event (a node
empties, a blocked job starts or is cancelled). Keeping them here, owned by one
``core.Scheduler``, lets the simulator and the live placer decide power the same way, and the
memos below (the same inputs give the same empty plan) keep a step cheap on a long replay.
Node indices are the view's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from libs.policy import fast as K
from libs.policy import power
from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.fast.shapes import per_shape, static_masks
from libs.policy.gang_pass import gang_shapes
from libs.policy.profiles import ProfileTable
from libs.policy.queue import PendingQueue
from libs.policy.stages.hold import hold_gpus
from libs.policy.types import CycleResult
from libs.policy.warm import WarmHistory
from proto.jobs import WORKLOAD_CLASSES


@dataclass(frozen=True, slots=True)
class PowerStep:
    """One step's decision: view indices to suspend and to resume now, and when to ask again
    (None: not before something changes)."""

    suspend: tuple[int, ...]
    resume: tuple[int, ...]
    next_s: float | None
    warm: tuple[int, ...] = ()  # of ``resume``: the nodes woken to refill the warm reserve


_NO_KEEP = np.zeros(0, dtype=np.int64)


def wake_orders(view: ClusterView, profiles: ProfileTable) -> tuple[np.ndarray, np.ndarray]:
    """(fastest first, greenest first): the orders in which suspended nodes are woken.

    Fastest by mean speed over workload classes (a long job waiting for a fast GPU wakes a fast
    node); greenest by mean energy per unit of work, for green jobs (``scores.is_green``), so
    their demand does not wake a fast, power-hungry node. Ties by view order."""
    n = len(view.node_ids)
    models = tuple(view.models)
    speed = profiles.speed_matrix(models, WORKLOAD_CLASSES)
    fastest = np.lexsort((np.arange(n), -speed.mean(axis=1)[view.model_idx]))
    epw = (profiles.power_matrix(models, WORKLOAD_CLASSES) / speed).mean(axis=1)
    greenest = np.lexsort((np.arange(n), epw[view.model_idx]))
    return fastest, greenest


class PowerState:
    """Power states and idle times of the nodes, and the blocked demand (see module doc)."""

    def __init__(
        self, view: ClusterView, cfg: PolicyConfig, profiles: ProfileTable, now: float = 0.0
    ) -> None:
        n = len(view.node_ids)
        self.view = view
        self.cfg = cfg
        self.idle_since = np.full(n, float(now))  # since when each empty node holds nothing
        self.suspended = np.zeros(n, dtype=bool)
        self.resuming = np.zeros(n, dtype=bool)
        # the jobs the last backfill pass could not start, in rank order: their queue entries
        # (PendingQueue.seq) -> position, gone since, request shape, green
        self._blocked_key = b""
        self._blocked_at: dict[float, int] = {}
        self._blocked_gone = np.zeros(0, dtype=bool)
        self._blocked_shape = np.zeros(0, dtype=np.int64)
        self._blocked_green = np.zeros(0, dtype=bool)
        self._blocked_ver = 0  # bumped when the blocked jobs change (the memos' key)
        self._blocked_left = 0  # blocked jobs that left the queue since (started, cancelled)
        self._plan_key: tuple | None = None  # inputs of the last plan, when it was empty
        self._last_step: tuple | None = None  # (inputs, view.gen or None, next due) of a no-op
        self._demands: dict[str, power.Demand] = {}
        self._demand_key: tuple | None = None
        self.reserved: tuple[int, ...] = ()
        self.rooms: tuple[int, ...] = ()  # nodes moves hold as rooms (``hold_rooms``)
        self.warm = WarmHistory(view, cfg)  # the recent starts: the warm reserve's demand
        self._wake_order, self._green_wake_order = wake_orders(view, profiles)

    def use_profiles(self, view: ClusterView, profiles: ProfileTable) -> None:
        """A new profile table: the wake orders follow its speeds and powers."""
        self._wake_order, self._green_wake_order = wake_orders(view, profiles)

    # ----- facts ---------------------------------------------------------------------------
    def node_emptied(self, i: int, now: float) -> None:
        self.idle_since[i] = now

    def node_taken(self, i: int) -> None:
        self.idle_since[i] = np.nan

    def started(self, i: int, gpus: float, high: bool, now: float) -> None:
        """A job started on node ``i`` (every start, placed by a pass or found running): the
        warm reserve's demand (``libs.policy.warm``)."""
        self.warm.started(int(self.view.model_idx[i]), gpus, high, now)

    def left_queue(self, seq: float) -> None:
        """A queue entry left (started or cancelled): if it was blocked, it no longer asks."""
        k = self._blocked_at.get(seq)
        if k is not None:
            self._blocked_left += 1
            self._blocked_gone[k] = True

    def resumed(self, i: int, now: float) -> None:
        """Node ``i`` finished booting: awake and idle from now."""
        self.resuming[i] = False
        self.idle_since[i] = now
        self._last_step = None  # its power state and idle time changed: decide afresh

    def note_blocked(
        self, res: CycleResult, queue: PendingQueue, green: Callable[[], np.ndarray]
    ) -> None:
        """After a backfill pass: the walked jobs that did not start are the demand.

        Every walked job that did not start waits for capacity, for a reserved node or for a
        fast GPU (SlowGPU: fast nodes wake first). The same blocked jobs as last time (by
        their queue entries' insertion numbers) rebuild nothing: most passes end so, which is
        why ``green`` (1.0 per queue row for a green job) is asked only for new ones."""
        cap = self.cfg.power_demand_cap
        n_placed = len(res.assignments)
        rows = res.rank.order[: cap + n_placed] if res.rank is not None else np.zeros(0, int)
        if n_placed:  # placed jobs are still queued (they start after the pass)
            pos = queue.position
            for pj, _ in res.assignments:
                rows = rows[rows != pos(pj.spec.id)]
        rows = rows[:cap]
        seqs = queue.seq()[rows]
        key = seqs.tobytes()  # whole numbers as floats: equal bytes iff equal lists
        if key != self._blocked_key:
            self._blocked_ver += 1
            self._blocked_key = key
            self._blocked_at = {q: k for k, q in enumerate(seqs.tolist())}
            self._blocked_gone = np.zeros(len(rows), dtype=bool)
            self._blocked_shape = queue.shapes()[0][rows]
            self._blocked_green = green()[rows] == 1.0
        resv = [res.reservation, *res.extra_reservations]
        self.reserved = tuple(r.node_index for r in resv if r is not None)

    def use_policy(self, cfg: PolicyConfig) -> None:
        """The config in force from now (a day/night switch, ``libs.policy.daynight``): its
        warm reserve may differ, so no memoised step or plan of the old one is reused."""
        self.cfg = cfg
        self._last_step = self._plan_key = None

    def hold_rooms(self, rooms: tuple[int, ...]) -> tuple[int, ...]:
        """The nodes moves hold as rooms for their jobs (``core_moves``): none is suspended
        (a promised room stays), and one that sleeps is woken now, for a victim that resumes
        there once it is up (``stages.boot``). The nodes woken."""
        self.rooms = rooms
        woken = tuple(i for i in rooms if self.suspended[i])
        for i in woken:
            self.suspended[i] = False
            self.resuming[i] = True
        if woken:
            self._last_step = None
        return woken

    # ----- the decision --------------------------------------------------------------------
    def step(self, now: float, queue: PendingQueue) -> PowerStep:
        """Which empty nodes to suspend and which to resume now (applied to the states here;
        the caller cordons suspended and booting nodes in the view)."""
        view = self.view
        # nothing changed since a step that decided nothing, and no node has become due to
        # sleep since: the same answer. A step reads which nodes are empty (view.empty_gen)
        # and, only when some node is due, the free GPUs of the warm reserve (view.gen)
        keep, keep_next = self._keep(now)
        key = (
            view.empty_gen,
            self._blocked_ver,
            self._blocked_left,
            self.reserved + self.rooms,
            keep.tobytes(),
            view.state_gen,
        )
        last = self._last_step
        if (
            last is not None
            and last[0] == key
            and (last[1] is None or last[1] == view.gen)
            and (last[2] is None or now < last[2])
        ):
            return PowerStep((), (), last[2])
        due, any_asleep, any_due, nxt = self._due(now)
        if any_asleep or any_due:
            p = self._plan(now - self.idle_since, due, queue, keep)
        else:  # nothing asleep and nothing to put to sleep (power.plan would say so)
            p = power.PowerPlan((), ())
        for i in p.suspend:
            self.suspended[i] = True
        for i in p.resume:
            self.suspended[i] = False
            self.resuming[i] = True
        if p.suspend or p.resume:  # next look: when the next awake idle node becomes due
            nxt = self._due(now)[3]
        if any_due:  # a due node the reserve keeps sleeps once the reserve shrinks by ageing
            nxt = min(nxt, keep_next)
        next_s = None if nxt == np.inf else float(nxt)
        gen = view.gen if any_due else None
        self._last_step = None if p.suspend or p.resume else (key, gen, next_s)
        return PowerStep(tuple(p.suspend), tuple(p.resume), next_s, tuple(p.warm))

    def _keep(self, now: float) -> tuple[np.ndarray, float]:
        """(the warm reserve per GPU model, when it may next shrink by ageing, or inf)."""
        if not self.cfg.warm_reserve:
            return _NO_KEEP, np.inf
        return self.warm.keep(now)

    def high_hold(self, now: float) -> np.ndarray | None:
        """int[model]: whole GPUs ``stages.hold`` keeps for high-priority jobs per GPU model,
        or None (``warm_high_hold_gpus`` 0, no warm reserve, or nothing held)."""
        cfg = self.cfg
        if not (cfg.warm_high_hold_gpus > 0 and cfg.warm_reserve):
            return None
        view = self.view
        sleeping = np.zeros(len(view.models), dtype=bool)
        sleeping[view.model_idx[self.suspended | self.resuming]] = True
        if not sleeping.any():
            return None
        return hold_gpus(cfg.warm_high_hold_gpus, self.warm.had_high(now), sleeping)

    def kept_by_reserve(self, i: int, now: float) -> str | None:
        """Why awake node ``i`` is not suspended, when the warm reserve is the reason (its
        GPU model has no more spare nodes than it keeps); None otherwise."""
        keep, _ = self._keep(now)
        m = int(self.view.model_idx[i])
        if not len(keep) or keep[m] <= 0:
            return None
        awake = ~self.suspended & ~self.resuming
        claim = np.where(self.resuming, self.view.gpu_total, 0.0)  # as if nothing claimed
        spare = power.spare_nodes(self.view, awake, self.resuming, claim, self.reserved)
        if not spare[i] or int(spare[self.view.model_idx == m].sum()) > keep[m]:
            return None
        return "warm reserve: " + self.warm.describe(m, now)

    def _due(self, now: float) -> tuple[np.ndarray, bool, bool, float]:
        """(nodes due to sleep, any asleep, any due, when the next awake idle node becomes due
        or inf): one compiled pass over the nodes (``fast.power_due``)."""
        return K.power_due(
            now,
            self.idle_since,
            self.suspended,
            self.resuming,
            power.empty_nodes(self.view),
            self.cfg.suspend_after_s,
        )

    def _plan(
        self, idle: np.ndarray, due: np.ndarray, queue: PendingQueue, keep: np.ndarray
    ) -> power.PowerPlan:
        """``power.plan`` for the blocked jobs still queued: green jobs' demand first wakes
        the greenest nodes, the rest the fastest.

        Memoised while it decides nothing: the same blocked jobs still queued, power states,
        reservations and nodes due to sleep give the same empty plan. Free resources
        (view.gen) matter only through the warm reserve when some node is due to sleep."""
        view = self.view
        reserve_reads_view = due.any() and self.cfg.warm_reserve_frac > 0
        key = (
            view.gen if reserve_reads_view else None,
            self._blocked_left,
            self._blocked_ver,
            self.reserved + self.rooms,
            self.suspended.tobytes(),
            self.resuming.tobytes(),
            due.tobytes(),
            keep.tobytes(),
            view.state_gen,
        )
        if key == self._plan_key:
            return power.PowerPlan((), ())
        green = self._demand("green", queue)
        early: tuple[int, ...] = ()
        suspended, resuming = self.suspended, self.resuming

        def plan(jobs: power.Demand, prefer: np.ndarray, warm: bool) -> power.PowerPlan:
            return power.plan(
                view,
                idle_s=idle,
                suspended=suspended,
                resuming=resuming,
                blocked=jobs,
                reserved=self.reserved + self.rooms,
                cfg=self.cfg,
                prefer=prefer,
                keep_nodes=keep if warm and len(keep) else None,
            )

        demand = "in_order"
        if green.groups and suspended.any():
            # green jobs first wake the greenest nodes; the plan below then sees those nodes
            # booting (green jobs listed first claim them) and decides the rest as usual
            early = plan(green, self._green_wake_order, False).resume
            if early:
                suspended, resuming = suspended.copy(), resuming.copy()
                suspended[list(early)] = False
                resuming[list(early)] = True
            demand = "green_first"
        # the reserve is refilled after the blocked jobs' wakes, fastest nodes first
        p = plan(self._demand(demand, queue), self._wake_order, True)
        p = power.PowerPlan(p.suspend, early + p.resume, p.warm)
        self._plan_key = key if not p.suspend and not p.resume else None
        return p

    def _demand(self, which: str, queue: PendingQueue) -> power.Demand:
        """The blocked jobs still queued as a ``power.Demand``: "green" (the green ones),
        "green_first" or "in_order"; built when first asked for, kept until they change."""
        key = (self._blocked_ver, self._blocked_left)
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
            specs = queue.shapes()[2]
            hit = power.Demand.of_shapes(ids, specs, self.cfg.power_demand_cap)
            self._keep_static(hit, ids, specs)
            self._demands[which] = hit
        return hit

    def _keep_static(self, demand: power.Demand, ids: np.ndarray, specs: list) -> None:
        """Hand ``demand`` its groups' static masks and gangs from the per-shape arrays of the
        queue's shape list (``fast.shapes.per_shape``, the ones the pass reads): a fancy
        index instead of a stack of masks and a gang test per group (``Demand.keep_static``)."""
        if not demand.groups:
            return
        view = self.view
        uniq, _ = K.groups_in_order(np.asarray(ids, dtype=np.int64)[: self.cfg.power_demand_cap])
        static = per_shape(view, "static_masks", specs, static_masks(view))[uniq]
        gang = per_shape(view, "gang", specs, lambda sp: gang_shapes(view, sp))[uniq]
        demand.keep_static(view, static, [specs[u] for u in uniq[gang].tolist()])
