"""Pick: the walk's step for one queued row, in rank order. Filter (the failed-shape memo, the
largest-free-block check), the slow/energy guard's held models, then ``placement.place``
(filter, score and pick over the nodes); a refusal on reserved nodes may still backfill onto
one (``fast.reservations``); a start is allocated on the view at once. ``Pass`` holds what the
pass learnt so far (head job, reservations, refused shapes), so every later row reads it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from libs.policy import backfill as B
from libs.policy import filters as F
from libs.policy import gang_pass as GP
from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.daynight import HEADROOM, headroom_gpus, holds_off
from libs.policy.fast import walk as W
from libs.policy.fast.codes import SlowCodes
from libs.policy.fast.largest import LargestFree
from libs.policy.fast.reservations import (
    reserve_extra,
    reserve_head,
    running_set,
)
from libs.policy.fast.screen import DeadRows
from libs.policy.fast.shapes import per_shape, shapes_of
from libs.policy.placement import PlaceContext, place
from libs.policy.profiles import ProfileTable
from libs.policy.queue import PendingQueue, QueueArrays
from libs.policy.scores import SizeMix, default_mix
from libs.policy.stages import heat as H
from libs.policy.stages.hold import HIGH_HOLD, PassHold
from libs.policy.step_outcomes import RowOutcomes
from libs.policy.types import PendingJob, Placement, Refusal, Reservation, RunningJob
from proto.jobs import HIGH_PRIORITY


def failed_memo(view: ClusterView, cfg: PolicyConfig) -> dict[tuple, str]:
    """Request shape -> why it fits no node, kept on the view ACROSS passes while nothing was
    freed (``view.freed_gen``): taking resources can only make a misfit worse, so the answer
    stays exact. "Reserved" refusals depend on the reservation and are never stored."""
    hit = view.memo.failed
    if hit is None or hit[0] != view.freed_gen or hit[1] is not cfg:
        hit = (view.freed_gen, cfg, {})
        view.memo.failed = hit
    return hit[2]


def fill_test(largest: LargestFree, assigned: list, cap: int) -> Callable[[], bool]:
    """``Pass.full`` for the bulk walk, which keeps it: a closure over the fill state, not a
    bound method, which would make walk and pass a reference cycle (see test_garbage.py)."""
    return lambda: largest.max_share < EPS or len(assigned) >= cap


def place_context(pending, q, is_queue: bool, view, profiles, cfg) -> PlaceContext:
    """The pass's ``PlaceContext``, with the size mix of what is queued."""
    fallback = default_mix(view, cfg)
    mix = pending.size_mix(fallback) if is_queue else SizeMix.from_requests(q.gpus, fallback)
    return PlaceContext.build(view, profiles, cfg, mix)


class Pass(RowOutcomes):
    """One pass's state and its step per walked row (``try_row``). The view is updated in place
    by every start."""

    __slots__ = (
        "_combined",
        "_largest",
        "_resv_held",
        "_resv_mask",
        "assignments",
        "backfill",
        "behind_head",
        "can_bulk",
        "cfg",
        "codes",
        "cool",
        "ctx",
        "dead",
        "extra_heads",
        "extras",
        "failed",
        "free_gpus",
        "gang_shape",
        "head",
        "headroom",
        "heat_fail",
        "heat_memory",
        "hold",
        "is_queue",
        "jobs",
        "max_extra",
        "max_share",
        "max_whole",
        "n_extra_done",
        "now",
        "pending",
        "profiles",
        "q",
        "rel",
        "rel_owned",
        "reservation",
        "reserved_tried",
        "resv_fail",
        "running",
        "seen",
        "shape_ids",
        "shape_keys",
        "shape_of",
        "shape_specs",
        "slow_fail",
        "started",
        "view",
        "waiting",
        "walked",
    )

    def __init__(
        self,
        pending: Sequence[PendingJob],
        q: QueueArrays | None,
        view: ClusterView,
        running: Sequence[RunningJob] | B.RunningSet,
        walked: W.Walk,
        *,
        now: float,
        profiles: ProfileTable,
        cfg: PolicyConfig,
        backfill: bool,
        reasons: bool,
        max_free: tuple[int, float],
        heat_memory: H.HeatMemory | None = None,
        high_hold: np.ndarray | None = None,
    ) -> None:
        self.pending, self.q, self.view, self.running = pending, q, view, running
        self.walked = walked
        self.now, self.profiles, self.cfg, self.backfill = now, profiles, cfg, backfill
        self.is_queue = is_queue = isinstance(pending, PendingQueue)
        self.max_whole, self.max_share = max_free
        self._largest = LargestFree(view, max_free)
        self.assignments: list[tuple[PendingJob, Placement]] = []
        self.waiting: dict[str, str] = {}
        self.ctx: PlaceContext | None = None
        self.failed = failed_memo(view, cfg)
        self.head: PendingJob | None = None  # the blocked job backfill protects
        self.reservation: Reservation | None = None
        self.rel: B.RunningSet | None = running if isinstance(running, B.RunningSet) else None
        self.rel_owned = False  # True once we copied ``running`` into our own RunningSet
        self.started: list[RunningJob] = []
        self.behind_head = 0
        self.reserved_tried = False
        self.seen: list[int] = []  # rows walked one at a time (before the bulk switch)
        self.resv_fail: set[tuple] = set()  # shapes refused "Reserved" in this pass
        # further blocked jobs protected by their own reservation (Slurm-like, after the
        # head's): the first cfg.reservations - 1 blocked jobs below the head, in rank order
        self.extra_heads: list[PendingJob] = []
        self.extras: list[tuple[PendingJob, Reservation]] = []
        self.n_extra_done = 0
        self.max_extra = max(0, cfg.reservations - 1)
        self.slow_fail: set[tuple] = set()  # (shape, slow-model code) refused "SlowGPU"
        # stages.heat: the nodes a stuck long job keeps off while it may wait (None: none is
        # risky, the usual case), and the shapes refused "HotNode" in this pass
        self.cool: np.ndarray | None = ~view.heat_risky if view.heat_risky.any() else None
        self.heat_fail: set[tuple] = set()
        self.heat_memory = heat_memory  # stages.heat: each job's wait for heat so far
        # stages.hold: the GPUs kept for high-priority jobs (None: none)
        self.hold = None if high_hold is None else PassHold(high_hold)
        # day/night (libs.policy.daynight): whole GPUs kept free for inference jobs, and the
        # whole free GPUs of available nodes, kept in step with the pass's starts
        self.headroom = headroom_gpus(view.total_gpus(), cfg)
        self.free_gpus = int(view.whole_free[~view.cordoned].sum()) if self.headroom else 0
        # nodes not reserved (rebuilt when the reservations change) and that mask combined
        # with each slow-model code's (read-only by convention: shared by the pass's rows)
        self._resv_held: tuple | None = None
        self._resv_mask: np.ndarray | None = None
        self._combined: dict[tuple, np.ndarray] = {}
        # slow-guard code per row (bit m: GPU model m too slow for it now), rows asked only
        self.codes: SlowCodes | None = None
        if is_queue:
            self.shape_of, self.shape_keys, self.shape_specs = pending.shapes()
            self.shape_ids = pending.shape_ids()
        else:
            self.shape_of, self.shape_keys, self.shape_specs = shapes_of(pending)
            self.shape_ids = {k: i for i, k in enumerate(self.shape_keys)}
        self.jobs = pending.jobs() if is_queue else pending  # plain list access per row
        # per shape: a gang (``gang_pass``); None when no queued row is one
        gangs = per_shape(view, "gang", self.shape_specs, lambda sp: GP.gang_shapes(view, sp))
        self.gang_shape = gangs if gangs.any() and gangs[self.shape_of].any() else None
        # Once the head (and the extra blocked jobs) are known, a row whose shape already
        # failed in this pass changes nothing but its own reason: with reasons=False the walk
        # drops such rows in bulk (``Walk.skip_dead``). Not with a finite backfill_depth
        # below the queue's length, where every row passed over counts towards the depth.
        deep = cfg.backfill_depth >= len(pending)
        self.can_bulk = W.BULK_SKIP and is_queue and not reasons and backfill and deep
        self.dead: DeadRows | None = None  # what the bulk walk drops (from the switch on)

    # -- the walk's control --------------------------------------------------------------

    def full(self) -> bool:
        """Nothing more can start in this pass."""
        return self.max_share < EPS or len(self.assignments) >= self.cfg.max_places_per_pass

    def behind_head_step(self) -> bool:
        """The walk reached a row below the blocked job(s): count it against the backfill
        depth and reserve for them now (False: the pass stops here). When is decided by the
        walk alone (not by what the memos know of this row), so a warm view and a cold copy,
        or the bulk and the row-by-row walk, report the same reservations."""
        if not self.backfill:
            return False
        self.behind_head += 1
        if self.behind_head > self.cfg.backfill_depth:
            return False
        if not self.reserved_tried:
            self.reserved_tried = True
            self.reserve_head()
        if self.n_extra_done < len(self.extra_heads):  # blocked jobs met since
            self.rel, self.rel_owned = running_set(
                self.rel, self.rel_owned, self.running, self.started
            )
            for h in self.extra_heads[self.n_extra_done :]:
                taken = [r.node_index for _, r in self.extras]
                if self.reservation is not None:
                    taken.append(self.reservation.node_index)
                if self.is_gang(h):
                    rs = GP.reserve(h, self.view, self.rel, taken, self.now, self.cfg)
                    self.extras += [(h, r) for r in rs]
                    continue
                n_run = len(self.running) + len(self.started)
                r = reserve_extra(h, self.view, self.rel, taken, n_run, self.now, self.cfg)
                if r is not None:
                    self.extras.append((h, r))
            self.n_extra_done = len(self.extra_heads)
        return True

    def reserve_head(self) -> None:
        if self.head is not None and self.is_gang(self.head):  # a node per part (gang_pass)
            GP.reserve_head(self)
            return
        self.reservation, self.rel, self.rel_owned = reserve_head(
            self.head, self.view, self.rel, self.rel_owned, self.running, self.started,
            self.now, self.cfg,
        )  # fmt: skip

    def maybe_bulk(self, walked_limit: int | None) -> None:
        """Switch the walk to bulk mode once the blocked jobs are known (``can_bulk``)."""
        known = self.head is not None and len(self.extra_heads) >= self.max_extra
        if not (self.can_bulk and known):
            return
        view = self.view
        self._need_codes()
        dead = self.dead = DeadRows(
            self.shape_of, self.shape_specs, self.codes, len(view.models), view, self.gang_shape
        )
        dead.failed_shapes(self.shape_ids[k] for k in self.failed if k in self.shape_ids)
        for k, c in self.slow_fail:
            dead.slow_refused(self.shape_ids[k], c)
        dead.block(self.max_share, self.max_whole)
        prefix = None if walked_limit is None else max(1, walked_limit)
        full = fill_test(self._largest, self.assignments, self.cfg.max_places_per_pass)
        self.walked.skip_dead(dead, full, prefix)
        # the reservations are made (``behind_head_step``): drop what cannot start
        dead.screen(
            view, self.cfg, self.unreserved(), self.shape_specs, self.shape_keys, self.failed
        )
        self.walked.refilter()

    def is_gang(self, job: PendingJob) -> bool:
        """``job`` (queued) is a gang: it spans nodes (``gang_pass``)."""
        if self.gang_shape is None:
            return False
        return bool(self.gang_shape[self.shape_ids[F.shape_key(job.spec)]])

    def unreserved(self) -> np.ndarray | None:
        """bool[N], the nodes no reservation of the pass holds (None: no reservation)."""
        if self.reservation is None and not self.extras:
            return None
        held = (None if self.reservation is None else self.reservation.node_index, len(self.extras))
        if held != self._resv_held:  # the reserved nodes changed: rebuild the mask once
            self._resv_held = held
            mask = self._resv_mask = np.ones(len(self.view.node_ids), dtype=bool)
            if self.reservation is not None:
                mask[self.reservation.node_index] = False
            for _, r in self.extras:
                mask[r.node_index] = False
            self._combined.clear()
        return self._resv_mask

    def _need_codes(self) -> None:
        if self.ctx is None:
            self.ctx = place_context(
                self.pending, self.q, self.is_queue, self.view, self.profiles, self.cfg
            )
        if self.codes is None:
            self.codes = SlowCodes(
                self.pending, self.q, self.shape_of, self.shape_specs, self.view, self.ctx,
                self.cfg, self.now,
            )  # fmt: skip

    # -- one row -------------------------------------------------------------------------

    def heat_waited(self, job_id: str) -> float:
        """How long ``job_id`` has waited for heat already (``stages.heat``)."""
        return 0.0 if self.heat_memory is None else self.heat_memory.waited_at(job_id, self.now)

    def try_row(self, i: int) -> None:
        """Start row ``i`` now, or record why it waits."""
        job = self.jobs[i]
        spec = job.spec
        if self.headroom and holds_off(spec.kind, spec.gpus, self.free_gpus, self.headroom):
            self.waiting[spec.id] = HEADROOM  # the GPUs left are kept for inference
            return
        key = (spec.gpus, spec.gpu_mem_gb, spec.host_mem_gb, spec.cpus, spec.constraints)
        why = self.failed.get(key)
        if why is None and self.gang_shape is not None and self.gang_shape[self.shape_of[i]]:
            GP.try_gang(self, i, job, key)
            return
        g = spec.gpus
        if why is None and (
            g > self.max_share + EPS if g < 1.0 - EPS else round(g) > self.max_whole
        ):
            # larger than any free block: it waits on Resources if some node could ever hold
            # it (else place() reports the precise never-fits reason)
            ever = self.view.shape_memo.ever_fits.get(key)
            if ever is None:
                ever = F.can_ever_fit(spec, self.view)
            if ever:
                why = "Resources"
        if why is not None:
            self.waiting[spec.id] = why
            if why == "Resources":
                self._blocked(job)
            return
        if self.ctx is None:
            self.ctx = place_context(
                self.pending, self.q, self.is_queue, self.view, self.profiles, self.cfg
            )
        allowed = None  # stages.hold: the nodes the high-priority hold leaves this row
        if self.hold is not None and spec.priority < HIGH_PRIORITY:
            allowed = self.hold.allowed(spec, self.view)
            if allowed is not None and self.hold.refused(key):
                self.waiting[spec.id] = HIGH_HOLD
                return
        mask = self.unreserved()
        held = False  # the slow-GPU guard holds some GPU models off for this row
        too = 0
        if spec.est_runtime_s >= self.cfg.slow_guard_runtime_s:
            if self.codes is None:
                self._need_codes()
            too = self.codes.row(i)
            if too:
                if (key, too) in self.slow_fail:  # same shape, same slow models: refused
                    self.waiting[spec.id] = "SlowGPU"
                    return
                held = True
                mask = self._fast_mask(too, mask)
        if mask is not None and key in self.resv_fail and self._ends_after_reserved(job):
            self.waiting[spec.id] = "Reserved"
            return
        heat = self.cool is not None and H.holds_off_risky(job, self.heat_waited(spec.id), self.cfg)
        if heat:  # stages.heat: it waits a while for a node that did not run hot
            if key in self.heat_fail:
                self.waiting[spec.id] = H.HOT_NODE
                return
            mask = self.cool if mask is None else mask & self.cool
        alone = mask is None  # the hold alone masks this row (its refusal holds per shape)
        if allowed is not None:
            mask = allowed if mask is None else mask & allowed
        res = place(spec, self.view, self.profiles, self.cfg, ctx=self.ctx, mask=mask)
        if allowed is not None and isinstance(res, Refusal) and res.reason == "Reserved":
            self.waiting[spec.id] = HIGH_HOLD  # it would take GPUs held for urgent jobs
            if alone:
                self.hold.refuse(key)
            return
        if heat and isinstance(res, Refusal) and res.reason == "Reserved":
            self.waiting[spec.id] = H.HOT_NODE  # only risky (or reserved) nodes could take it
            self.heat_fail.add(key)
            return
        if held and isinstance(res, Refusal) and res.reason == "Reserved":
            self._slow_refused(i, spec.id, key, too)
            return
        if isinstance(res, Refusal) and mask is not None and res.reason == "Reserved":
            res = self._backfill_reserved(job, res)
        if isinstance(res, Placement):
            self._start(job, res)
        else:
            self._refused(i, job, key, res, held)
