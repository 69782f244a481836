"""The scheduler's moving of jobs, as the part of ``core.Scheduler`` that decides it.

Why apart from ``core``: moving a job (``stages.preempt``) is its own idea with its own state
(``moves.MoveBook``) and its own events and decisions; ``core.Scheduler`` inherits these and
keeps the rest. What lives here:

* ``preempt_step`` (``burst_step``, ``priority_step``, ``short_step``, ``grow_step``) and
  ``next_move_s``: the burst rule's, the priority-protection rule's, the short-wait rule's (it
  takes only what the other two left of ``max_per_pass``) and the grow-back rule's decisions,
  and the instant a full cluster must look again;
* ``check_move`` and ``order_move``: the verdict on an intent and its record;
* ``moved_job``: a moved job as it waits again (first in line, with its resume deadline);
* rooms: a move holds the node it clears for the job it is for, and the node each moved job
  resumes on (a cordon hold ``room:<job>``), until that job starts there (``_fill_rooms``,
  after each pass) or the resume bound passes. That is what keeps the promise the plan made:
  without them the room went to whoever ranked first (measured on the first 8k Philly jobs:
  p99 resume delay 20 h, and the high-priority job preempted for again and again).
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

import numpy as np

from libs.policy.core_power import POWER_HOLD
from libs.policy.decisions import MoveOrder
from libs.policy.placement import to_allocation
from libs.policy.queue import COLUMNS
from libs.policy.scores import ModelTables
from libs.policy.stages import boot as B
from libs.policy.stages import lease as L
from libs.policy.stages import resume as R
from libs.policy.types import CycleResult, PendingJob, Placement

if TYPE_CHECKING:
    from libs.policy.core import Scheduler

ROOM_HOLD = "room:"  # + job id: a node moves are clearing for that job (``_fill_rooms``)
COL_PRIO, COL_ENQ = COLUMNS.index("prio"), COLUMNS.index("enq")
BLOCKED_LOOKED_AT = 4  # blocked jobs, in rank order, the priority-protection rule looks at
# ... times this: the boot-protection rule makes a plan per job it serves in one look (a burst
# of arrivals finds the awake GPUs taken all at once), at most ``max_per_pass`` moves
BOOT_LOOKED_AT = 4


class MovesMixin:
    """``core.Scheduler``'s moving of jobs (see the module docstring)."""

    def moved_job(self: Scheduler, job: PendingJob, preempted_at: float) -> PendingJob:
        """``job`` as it waits again after a move at ``preempted_at``: first in line (its place
        counts ``resume_credit_s`` older) and with its resume deadline (``resume_bound_s``
        later), which the rank stage's urgency reads."""
        pc = self.cfg.preempt
        return PendingJob(
            job.spec,
            job.enqueued_at - pc.resume_credit_s,  # first in line (PreemptConfig.resume_credit_s)
            job.attempt,
            job.progress,
            resume_by=preempted_at + pc.resume_bound_s,
        )

    # ----- rooms ------------------------------------------------------------------------
    def _fill_rooms(
        self: Scheduler, res: CycleResult, now: float
    ) -> list[tuple[PendingJob, Placement]]:
        """After the pass: each job moves made room for starts in its room once the moved jobs
        are gone (``stages.resume.room_placement``), unless the pass placed it elsewhere, and
        once its node is up (a room may be on a node that boots: ``stages.boot``). A room
        lapses after the resume bound, or when its node is held for another reason."""
        if not self.moves.rooms:  # almost every pass: nothing is being made room for
            return []
        out = []
        placed = {pj.spec.id for pj, _ in res.assignments}
        for job_id, (node, until) in list(self.moves.rooms.items()):
            pj = self.queue.get(job_id)
            i = self.view.index[node]
            holds = self._holds.get(node, ())
            others = [h for h in holds if not h.startswith(ROOM_HOLD) and h != POWER_HOLD]
            saving = job_id in self.moves.moving  # a moved job's room waits for its save
            if until < now or others or (pj is None and not saving):
                self._release_room(job_id)
                continue
            if pj is None or job_id in placed or POWER_HOLD in holds:  # (or it still boots)
                continue
            placement = R.room_placement(pj.spec, self.view, i, self.cfg)
            if placement is not None:  # applied at once, as the pass applies its own
                self.view.allocate(to_allocation(pj.spec, placement, now, pj.attempt))
                self.power.node_taken(i)
                out.append((pj, placement))
        return out

    def _hold_rooms(self: Scheduler) -> None:
        for job_id, (node, _) in self.moves.rooms.items():
            self.set_cordoned(node, ROOM_HOLD + job_id, True)

    def _release_room(self: Scheduler, job_id: str) -> None:
        room = self.moves.rooms.pop(job_id, None)
        if room is not None:
            self.set_cordoned(room[0], ROOM_HOLD + job_id, False)

    def preempt_step(self: Scheduler, now: float) -> list[MoveOrder]:
        """The moves decided now: the ends of swap leases first (``lease_step``: a promise
        made earlier), the burst rule's next (``burst_step``: a latency target is at stake),
        then the priority-protection rule's (``priority_step``), which sees the burst's
        victims as being moved already, then the boot-protection rule's (``boot_step``) and
        the short-wait rule's with what is left of ``max_per_pass`` (``short_step``), then
        the grow-back (``grow_step``: after every rule that holds a node for a blocked job,
        so no grow takes those GPUs)."""
        ended = self.lease_step(now)
        done = ended + self.burst_step(now)
        done += self.priority_step(now)
        done += self.boot_step(now, self.cfg.preempt.max_per_pass - len(done))
        done += self.short_step(now, self.cfg.preempt.max_per_pass - len(done))
        return done + self.grow_step(now)

    def lease_step(self: Scheduler, now: float) -> list[MoveOrder]:
        """The short jobs whose swap lease ends now while they still hold their victims' node
        (``stages.lease``): each is checkpointed so the victims resume within their bound."""
        if not self.moves.leases:  # almost every instant
            return []
        waiting = self.queue.__contains__  # a victim still queued
        moves = self.moves.end_leases(now, waiting, self.cfg.preempt.resume_bound_s)
        if moves:
            self._hold_rooms()
        return moves

    def short_step(self: Scheduler, now: float, most: int) -> list[MoveOrder]:
        """The short-wait rule's moves (``stages.short_wait.short_plans``), at most ``most``
        (what the pass's other rules left of ``max_per_pass``) and at most once per
        ``PreemptConfig.interval_s``: for the queued short jobs past their wait bound
        (``eligible_rows``), most slowed first (waited / remaining), none that a move already
        makes room for, several plans per look (each node once) until ``most`` moves are
        ordered or ``BLOCKED_LOOKED_AT`` jobs in a row had no plan. Like the priority rule it
        reads only the queue and the running set both drivers share; its wake-up is
        ``_next_short_s`` (through ``next_move_s``)."""
        pc = self.cfg.preempt
        if not pc.short_enabled or most <= 0 or not self.moves.movers:
            return []
        if now < self.moves.short_due_s or not len(self.queue):
            return []
        self.moves.short_due_s = now + max(pc.interval_s, 1.0)
        speed = ModelTables.build(self.view, self.profiles).speed
        # ``short_wait.eligible_rows`` of the queue, from act times kept per row (fast.short_due)
        rows, rem = self.moves.short_wake.eligible(self.queue, now, speed.max(axis=0), pc)
        if not len(rows):
            self.moves.short_looked_s = now
            return []
        made = set(self.moves.rooms) | {m.for_job for m in self.moves.moving.values()}
        jobs = self.queue.jobs()
        cands = [(jobs[r], s) for r, s in zip(rows.tolist(), rem.tolist(), strict=True)]
        cands = [(pj, s) for pj, s in cands if pj.spec.id not in made]
        cands.sort(key=lambda c: (-(now - c[0].enqueued_at) / max(c[1], 1.0), c[0].spec.id))
        moves = self.moves.plan_short(cands, self.view, self.running, now, self.cfg, speed, most)
        if len(moves) < most:  # not cut short by the budget: every job owed a look had one
            self.moves.short_looked_s = now
        self._hold_rooms()
        return moves

    def grow_step(self: Scheduler, now: float) -> list[MoveOrder]:
        """The grow-back rule's moves (``stages.grow``), at every instant, after the other
        rules (a move for a blocked job holds its node first, so no grow takes those GPUs):
        none while a replica of a service waits or within ``grow_quiet_s`` of a burst move."""
        pc = self.cfg.preempt
        if not pc.grow_enabled or not self.moves.asked or self.scaler.waiting():
            return []
        q = self.queue
        moves = self.moves.plan_grow(self.view, q.jobs(), now, self.cfg, q.version)
        if moves:
            self._hold_rooms()
        return moves

    def burst_step(self: Scheduler, now: float) -> list[MoveOrder]:
        """The burst rule's moves (``stages.burst.burst_plan``), at every instant: for each
        replica of a service that waits (the pass could not place it), highest priority then
        oldest first, at most ``BLOCKED_LOOKED_AT``, none that a move already makes room for.
        Each plan's node is held for its replica at once (``_hold_rooms``), so the next
        replica's plan looks at other nodes and no two plans count the same GPUs."""
        if not self.cfg.preempt.burst_enabled or not self.moves.movers:
            return []
        waiting = self.scaler.waiting()
        if not waiting:  # almost every instant: no replica waits
            return []
        made = set(self.moves.rooms) | {m.for_job for m in self.moves.moving.values()}
        blocked = [pj for j in waiting if j not in made and (pj := self.queue.get(j)) is not None]
        blocked.sort(key=lambda pj: (-pj.spec.priority, pj.enqueued_at, pj.spec.id))
        out: list[MoveOrder] = []
        speed = ModelTables.build(self.view, self.profiles).speed  # victims resume no slower
        for pj in blocked[:BLOCKED_LOOKED_AT]:
            moves = self.moves.plan_burst([pj], self.view, self.running, now, self.cfg, speed)
            if moves:
                out += moves
                self._hold_rooms()
        return out

    def priority_step(self: Scheduler, now: float) -> list[MoveOrder]:
        """The moves of the priority-protection rule (``stages.preempt.priority_plan``), at
        most once per ``PreemptConfig.interval_s``: for the waiting jobs of protected priority
        that have waited long enough, highest priority then longest wait first, none that a
        pass just placed or that a move under way already makes room for. The victims keep
        running (and holding) until the driver reports them ended.

        Jobs the last pass placed are running here, whether or not the driver has confirmed
        them yet (the simulator has, the live placer commits after the tick): both drivers see
        the same waiting and running jobs, so they decide the same."""
        pc = self.cfg.preempt
        if not pc.enabled or not self.moves.movers or now < self._preempt_due_s:
            return []
        waited = self.protected.waited_since(now - pc.min_wait_s)  # = self._waited_rows(now)
        if not waited:  # most instants: no protected job has waited long enough
            return []
        skip = {m.for_job for m in self.moves.moving.values()}
        blocked = [self.queue.get(j) for j in waited if j not in skip]
        if not blocked:
            return []
        self._preempt_due_s = now + max(pc.interval_s, 1.0)
        blocked.sort(key=lambda pj: (-pj.spec.priority, pj.enqueued_at, pj.spec.id))
        speed = ModelTables.build(self.view, self.profiles).speed
        moves = self.moves.plan_priority(
            blocked[:BLOCKED_LOOKED_AT], self.view, self.running, now, self.cfg, speed
        )
        self._hold_rooms()
        return moves

    def boot_step(self: Scheduler, now: float, most: int) -> list[MoveOrder]:
        """The boot-protection rule's moves (``stages.boot.boot_plan``), at most once per
        ``PreemptConfig.boot_interval_s`` and only while some node sleeps or boots: for the
        waiting jobs of ``boot_priority`` that have waited ``boot_min_wait_s`` (kept as the
        priority rule's, ``fast.protected``), highest priority then longest wait first, none
        that a move already makes room for; a plan per job, until ``most`` moves. It looks at
        the instants both drivers give the scheduler (no wake-up of its own: an arrival is
        one)."""
        pc = self.cfg.preempt
        if most <= 0 or not B.boot_enabled(self.cfg) or not self.moves.movers:
            return []
        if now < self._boot_due_s or not len(self.boot_waits):
            return []
        waited = self.boot_waits.waited_since(now - pc.boot_min_wait_s)
        asleep = self._asleep_only() if waited else None
        if asleep is None or not asleep.any():
            return []
        made = set(self.moves.rooms) | {m.for_job for m in self.moves.moving.values()}
        blocked = [self.queue.get(j) for j in waited if j not in made]
        if not blocked:
            return []
        self._boot_due_s = now + max(pc.boot_interval_s, 1.0)
        blocked.sort(key=lambda pj: (-pj.spec.priority, pj.enqueued_at, pj.spec.id))
        blocked = blocked[: BOOT_LOOKED_AT * BLOCKED_LOOKED_AT]
        speed = ModelTables.build(self.view, self.profiles).speed
        out: list[MoveOrder] = []
        while blocked and len(out) < most:  # a plan per job, each on nodes no other plan holds
            moves = self.moves.plan_priority(
                blocked, self.view, self.running, now, self.cfg, speed, asleep
            )
            if not moves:
                break
            out += moves
            self._hold_rooms()  # its rooms and the node it clears: no later plan counts them
            asleep = self._asleep_only()
            blocked = [pj for pj in blocked if pj.spec.id != moves[0].for_job]
        return out

    def _asleep_only(self: Scheduler) -> np.ndarray:
        """bool[N]: the nodes that sleep or boot and are held for that alone (no room of a
        move, no operator's or thermal cordon): the rooms ``boot_step`` may promise."""
        p = self.power
        out = p.suspended | p.resuming
        ids = self.view.node_ids
        for i in np.flatnonzero(out).tolist():
            if self._holds.get(ids[i], set()) != {POWER_HOLD}:
                out[i] = False
        return out

    def _protected_rows(self: Scheduler) -> np.ndarray:
        """Queue rows of protected priority (``PreemptConfig.protect_priority``): waiting
        jobs (a pass's placements left the queue at the pass, see ``schedule_pass``)."""
        if not len(self.queue):
            return np.zeros(0, dtype=np.int64)
        prio = self.queue.table()[:, COL_PRIO]
        return np.flatnonzero(prio >= self.cfg.preempt.protect_priority)

    def _waited_rows(self: Scheduler, now: float) -> np.ndarray:
        """The definition of the jobs the rule looks at now: queue rows of protected priority
        that have waited ``min_wait_s`` (``self.protected.waited_since`` answers the same
        without the scan: ``tests/policy/test_protected.py``)."""
        rows = self._protected_rows()
        enq = self.queue.table()[:, COL_ENQ]
        return rows[enq[rows] <= now - self.cfg.preempt.min_wait_s]

    def next_move_s(self: Scheduler, now: float) -> float | None:
        """The next instant after ``now`` a rule owes a full cluster a look, where no event
        may come for hours: when a waiting job of protected priority reaches ``min_wait_s``,
        when a queued short job reaches its wait bound (``_next_short_s``), when a shrunk
        job may grow back (``_next_grow_s``), when a swap lease ends (``stages.lease``); the
        earliest. Both drivers wake then."""
        pc = self.cfg.preempt
        at = [self._next_grow_s(now), L.next_end_s(self.moves.leases.values(), now)]
        if self.moves.movers:
            if pc.enabled:
                at.append(self.protected.next_ready_s(now, pc.min_wait_s))  # = _next_ready_s
            at.append(self._next_short_s(now))
        later = [t for t in at if t is not None]
        return min(later) if later else None

    def _next_short_s(self: Scheduler, now: float) -> float | None:
        """The short-wait rule's wake-up (``stages.short_wait.next_due_s``, kept across
        instants by ``fast.short_due``)."""
        pc = self.cfg.preempt
        if not pc.short_enabled or not len(self.queue):
            return None
        wake = self.moves.short_wake
        best = wake.fastest(ModelTables.build(self.view, self.profiles))
        looked, due = self.moves.short_looked_s, self.moves.short_due_s
        return wake.next_s(self.queue, now, best, pc, looked, due)

    def _next_grow_s(self: Scheduler, now: float) -> float | None:
        """When a shrunk job may next grow back (``stages.grow``): the end of the quiet window
        after a burst, or of a shrunk job's move window, whichever comes first after ``now``."""
        pc = self.cfg.preempt
        if not pc.grow_enabled or not self.moves.asked:
            return None
        at = self.moves.grow_times(pc)  # sorted, kept: the first one after now
        k = bisect.bisect_right(at, now)
        return at[k] if k < len(at) else None

    def _next_grow_scan_s(self: Scheduler, now: float) -> float | None:
        """The definition of ``_next_grow_s``'s answer, by a scan of the shrunk jobs (tested
        equal over a replay, ``tests/policy/test_plans.py``)."""
        pc = self.cfg.preempt
        if not pc.grow_enabled or not self.moves.asked:
            return None
        at = [self.moves.last_burst_s + pc.grow_quiet_s]
        at += [self.moves.moved_at.get(j, -np.inf) + pc.min_interval_s for j in self.moves.asked]
        later = [t for t in at if t > now]
        return min(later) if later else None

    def _next_ready_s(self: Scheduler, now: float) -> float | None:
        """The definition of ``next_move_s``'s answer, by a scan of the queue (tested equal
        to ``self.protected.next_ready_s``)."""
        rows = self._protected_rows()
        if not len(rows):
            return None
        at = self.queue.table()[rows, COL_ENQ] + self.cfg.preempt.min_wait_s
        later = at[at > now]
        return float(later.min()) if len(later) else None

    def check_move(
        self: Scheduler,
        job_id: str,
        attempt: int,
        node: str,
        now: float,
        shrink_to: int = 0,
        kind: str = "preempt",
    ) -> str:
        """The verdict on a move someone asks for (an intent of the defragmenter or the
        thermal guard): "" when ``stages.preempt`` allows it now, else why not. A shrink
        (``shrink_to``, ``stages.shrink``) resumes on the node it shrinks on, so its resume
        needs no room elsewhere; the size must be one the job may take. A migration (``kind``
        ``migrate``: it leaves a hot node) needs a room on a node that did not run hot
        (``stages.heat``): moving it to another hot node only moved the heat, and an 8-GPU job
        was migrated back and forth every hour, thirteen times (Philly, 10% of nodes hot)."""
        if node not in self.view.index:
            return f"unknown node {node!r}"
        cfg = self.cfg
        why = self.moves.check(job_id, attempt, node, self.view, self.running, now, cfg, shrink_to)
        if why or kind != "migrate" or shrink_to or not self.view.heat_risky.any():
            return why
        if not self.moves.room_for(job_id, self.view, self.running, now, cfg, cool_only=True):
            return "no room to resume on a node that did not run hot"
        return ""

    def order_move(self: Scheduler, move: MoveOrder, now: float) -> MoveOrder:
        """Record an accepted move (``check_move`` said yes): the job is being moved now; a
        move for another job holds the node it clears for that job (``_fill_rooms``). A
        migration holds no room: a room is a hold on a whole node, so the guard's second
        migration from a node found the first one's room cordoned and was refused (e2e
        ``test_thermal``); it resumes where the pass puts it, first in line, a node that did
        not run hot first when it is heat-averse (``stages.heat``)."""
        out = self.moves.order(move, now, self.cfg.preempt.resume_bound_s)
        self._hold_rooms()
        return out
