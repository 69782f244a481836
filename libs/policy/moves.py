"""What the scheduler remembers to move jobs safely: the state behind ``stages.preempt``.

Why a record of its own: the protection rules read history a pass does not carry (when each
running attempt started, when each job was last moved, which moves are under way), and the
priority-protection plan wants the running jobs that could ever be moved, per node, without a
walk over every running job. ``MoveBook`` keeps those incrementally as the scheduler's events
arrive (``started``, ``ended``); ``core.Scheduler`` owns one and asks it for decisions
(``plan_priority``) and for the verdict on an intent (``check``). Pure state, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from libs.policy.backfill import RunningSet
from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.decisions import MoveOrder
from libs.policy.fast.plans import GrowMemo, PlanMemo
from libs.policy.fast.short_due import ShortDue
from libs.policy.stages import boot as BT
from libs.policy.stages import burst as B
from libs.policy.stages import grow as G
from libs.policy.stages import lease as L
from libs.policy.stages import preempt as P
from libs.policy.stages import short_wait as SW
from libs.policy.stages.shrink import size_error
from libs.policy.types import PendingJob, RunningJob


def soon_free(view: ClusterView, running: RunningSet, now: float, bound_s: float) -> np.ndarray:
    """``stages.preempt.whole_free_within`` read off a ``RunningSet``: only nodes whose
    earliest expected end falls within the bound are walked, in end order (tested equal to
    the definition, ``tests/policy/test_preempt.py``)."""
    soon = view.whole_free.astype(float)
    if bound_s < 0:
        return soon
    horizon = now + bound_s
    first = running.first_end_array(len(view.node_ids))
    for i in np.flatnonzero(first <= horizon).tolist():
        for r in running.on_node(i):
            if r.expected_end > horizon:
                break
            if r.gpu_share >= 1.0 - EPS:
                soon[i] += len(r.gpu_indices)
    return soon


def _ends_bound(cfg: PolicyConfig) -> float:
    """How far ahead a resume may count on expected ends (``resume_counts_ends``)."""
    pc = cfg.preempt
    return pc.resume_bound_s if pc.resume_counts_ends else -1.0


def _level(job: RunningJob) -> int:
    return min(max(job.spec.priority, 0), P.PRIORITY_LEVELS - 1)


def could_ever_move(job: RunningJob) -> bool:
    """Checkpointable or elastic and not inference: the jobs a plan may consider at all."""
    return P.ever_movable(job.spec)


class MoveBook:
    def __init__(self, n_nodes: int) -> None:
        self.facts: dict[str, P.MoveFacts] = {}  # running job -> its attempt's history
        self.moved_at: dict[str, float] = {}  # job -> when it was last moved (across attempts)
        self.movers: dict[int, dict[str, RunningJob]] = {}  # node -> could-ever-move jobs
        self.attempts: dict[str, tuple[int, str]] = {}  # running job -> (attempt, node id)
        self.jobs: dict[str, RunningJob] = {}  # every running job
        self.moving: dict[str, MoveOrder] = {}  # ordered, not yet ended
        # job -> (the node moves are clearing for it, until when the room is held)
        self.rooms: dict[str, tuple[str, float]] = {}
        self.leases: dict[str, L.Lease] = {}  # short job -> its swap's lease (stages.lease)
        # GPUs the could-ever-move jobs hold, per priority and node (stages.preempt's bound)
        self.movable_gpus = np.zeros((P.PRIORITY_LEVELS, n_nodes))
        # shrunk job -> the size it held when first shrunk (stages.grow: it grows back to it)
        self.asked: dict[str, int] = {}
        self.last_burst_s = -np.inf  # when the burst rule last moved a job (grow's quiet)
        self.short_due_s = -np.inf  # the short-wait rule looks again from then (interval_s)
        self.short_looked_s = -np.inf  # its last look that looked at every job it owed one
        self.short_wake = ShortDue()  # its wake-up and eligible rows, kept per row (fast.short_due)
        # the rules' searches from memory while what they read holds (fast.plans)
        self.memo = PlanMemo()
        self.grow_memo = GrowMemo()
        # bumped when a shrunk job (``asked``) starts, ends, is ordered to move or is forgotten,
        # or ``asked`` changes: all the grow rule reads of this book (``fast.plans.GrowMemo``)
        self._ver = 0
        # per node, its movers not being moved and the GPUs they hold (``_candidates``), brought
        # up to date for the nodes whose movers or moves changed since (``_dirty``)
        self._free_movers: dict[int, list[RunningJob]] = {}
        self._free_movable = np.zeros(n_nodes)
        self._dirty: set[int] = set()
        self._grow_at: tuple[tuple, list[float]] | None = None  # ``grow_times``, with its key

    # ----- events --------------------------------------------------------------------------
    def started(self, job: RunningJob, attempt: int, node: str, at: float) -> None:
        jid = job.spec.id
        self._ver += jid in self.asked
        self._dirty.add(job.node_index)
        self.facts[jid] = P.MoveFacts(started_at=at, last_moved_at=self.moved_at.get(jid))
        self.attempts[jid] = (attempt, node)
        self.jobs[jid] = job
        if could_ever_move(job):
            self.movers.setdefault(job.node_index, {})[jid] = job
            self.movable_gpus[_level(job), job.node_index] += P.gpus_held(job)

    def ended(self, job_id: str, node_index: int) -> MoveOrder | None:
        """The attempt stopped; the order that stopped it, if it was a move."""
        self._ver += job_id in self.asked
        self._dirty.add(node_index)
        self.facts.pop(job_id, None)
        self.attempts.pop(job_id, None)
        self.jobs.pop(job_id, None)
        d = self.movers.get(node_index)
        if d is not None:
            job = d.pop(job_id, None)
            if job is not None:
                m = self.movable_gpus
                k = _level(job)
                m[k, node_index] = max(0.0, m[k, node_index] - P.gpus_held(job))
            if not d:
                del self.movers[node_index]
                self.movable_gpus[:, node_index] = 0.0  # no rounding dust on an empty node
        return self.moving.pop(job_id, None)

    def forget(self, job_id: str) -> None:
        """The job left for good (a terminal state)."""
        self._ver += job_id in self.asked
        self.moved_at.pop(job_id, None)
        self.asked.pop(job_id, None)

    # ----- decisions -----------------------------------------------------------------------
    def check(
        self,
        job_id: str,
        attempt: int,
        node: str,
        view: ClusterView,
        running: RunningSet,
        now: float,
        cfg: PolicyConfig,
        shrink_to: int = 0,
    ) -> str:
        """Why a move of ``job_id``'s attempt ``attempt`` on ``node`` is refused ("" if not);
        ``shrink_to``: an elastic shrink to that many GPUs (``stages.shrink``)."""
        held = self.attempts.get(job_id)
        if held is None:
            return "not running"
        if held != (attempt, node):
            return f"stale: attempt {held[0]} runs on {held[1]}"
        if job_id in self.moving:
            return "already being moved"
        job = self.jobs[job_id]
        if shrink_to:
            return P.protection(job, self.facts.get(job_id), now, cfg.preempt) or size_error(
                job.spec, shrink_to
            )
        soon = soon_free(view, running, now, _ends_bound(cfg))
        return P.may_move(job, self.facts, view, soon, now, cfg)

    def room_for(
        self,
        job_id: str,
        view: ClusterView,
        running: RunningSet,
        now: float,
        cfg: PolicyConfig,
        *,
        cool_only: bool = False,
    ) -> str:
        """Where a running job would resume if it left its node now: a room of its own on
        another node (``stages.preempt.resume_rooms``), with ``cool_only`` one that did not
        run hot (``stages.heat``'s risky nodes); "" when none has room now."""
        job = self.jobs.get(job_id)
        if job is None:
            return ""
        soon = soon_free(view, running, now, _ends_bound(cfg))
        avoid = view.heat_risky if cool_only and view.heat_risky.any() else None
        rooms = P.resume_rooms((job,), view, soon, cfg, exclude=job.node_index, avoid=avoid)
        return view.node_ids[rooms[job_id]] if rooms else ""

    def order(self, move: MoveOrder, now: float, room_s: float) -> MoveOrder:
        """Record a move decided or accepted now; a move that makes room for a job (``for_job``)
        holds the node it clears for that job for ``room_s``."""
        job = self.jobs.get(move.job_id)
        if job is not None:
            self._dirty.add(job.node_index)
        self._ver += move.job_id in self.asked  # (before and after: a shrink adds it)
        self.moving[move.job_id] = move
        self.moved_at[move.job_id] = now
        self._note_resize(move)
        self._ver += move.job_id in self.asked
        if move.for_job:
            self.rooms[move.for_job] = (move.node, now + room_s)
        if move.to_node:
            self.rooms[move.job_id] = (move.to_node, now + room_s)
        return move

    def _note_resize(self, move: MoveOrder) -> None:
        """Remember the size a job asked when a move first shrinks it (``stages.grow`` grows it
        back to that, never beyond), and forget it once a grow gives it back whole."""
        job = self.jobs.get(move.job_id)
        if job is None or not move.shrink_to:
            return
        held = len(job.gpu_indices)
        if move.shrink_to < held:
            self.asked.setdefault(move.job_id, held)
        elif move.shrink_to >= self.asked.get(move.job_id, move.shrink_to + 1):
            del self.asked[move.job_id]

    def plan_grow(
        self,
        view: ClusterView,
        waiting: Sequence[PendingJob],
        now: float,
        cfg: PolicyConfig,
        waiting_version: int | None = None,
    ) -> list[MoveOrder]:
        """The grow-back rule's moves (``stages.grow``): each resumes at once on more GPUs of
        its own node, its room held there (``to_node``), as a shrink does. With
        ``waiting_version`` (``PendingQueue.version`` of ``waiting``) a refusal that still
        holds is taken from memory (``fast.plans.GrowMemo``)."""
        quiet = now - self.last_burst_s >= cfg.preempt.grow_quiet_s
        if not cfg.preempt.grow_enabled or not quiet or not self.asked:
            return []  # (grow_plan's own first answer)
        memo, ver = self.grow_memo, self._ver
        if waiting_version is not None and memo.holds(ver, view, cfg, waiting_version, now):
            if memo.verify:
                self._verify_no_grow(view, waiting, now, cfg)
            return []
        # the shrunk ones only (a few), not every running job: this runs at every instant
        jobs = {j: self.jobs[j] for j in self.asked if j in self.jobs and j not in self.moving}
        if waiting_version is None:
            grows = G.grow_plan(self.asked, jobs, view, waiting, self.facts, now, cfg, quiet=quiet)
        else:
            grows = memo.plan(
                ver, self.asked, jobs, view, waiting, waiting_version, self.facts, now, cfg
            )
        out = []
        for job, to, reason in grows:
            attempt, node = self.attempts[job.spec.id]
            mo = MoveOrder(
                job.spec.id, attempt, node, "preempt", reason, to_node=node, shrink_to=to
            )
            out.append(self.order(mo, now, cfg.preempt.resume_bound_s))
        return out

    def grow_times(self, pc: P.PreemptConfig) -> list[float]:
        """The instants the grow rule may next act at, sorted: the end of the quiet window
        after a burst, and of each shrunk job's move window (``core_moves._next_grow_s``).
        Kept until a shrunk job or the last burst changes (``_ver``): it is asked at every
        instant."""
        key = (self._ver, self.last_burst_s)
        kept = self._grow_at
        if kept is not None and kept[0][:2] == key and kept[0][2] is pc:
            return kept[1]
        at = [self.last_burst_s + pc.grow_quiet_s]
        at += [self.moved_at.get(j, -np.inf) + pc.min_interval_s for j in self.asked]
        at.sort()
        self._grow_at = ((*key, pc), at)
        return at

    def _verify_no_grow(
        self, view: ClusterView, waiting: Sequence[PendingJob], now: float, cfg: PolicyConfig
    ) -> None:
        """``GrowMemo.verify``: the definition grows no one either."""
        jobs = {j: self.jobs[j] for j in self.asked if j in self.jobs and j not in self.moving}
        if G.grow_plan(self.asked, jobs, view, waiting, self.facts, now, cfg, quiet=True):
            raise AssertionError(f"grow memo: no grow kept at {now}, but the rule grows")

    def plan_priority(
        self,
        blocked: Sequence[PendingJob],
        view: ClusterView,
        running: RunningSet,
        now: float,
        cfg: PolicyConfig,
        speed: np.ndarray | None = None,
        asleep: np.ndarray | None = None,
    ) -> list[MoveOrder]:
        """The priority-protection rule's moves for this pass (``stages.preempt``), ordered;
        with ``speed`` (float[M, C]) each victim's room is no slower than where it runs; with
        ``asleep`` (bool[N]) the boot-protection rule's instead (``stages.boot``)."""
        movers, soon, _ = self._candidates(view, running, now, cfg)
        args = (movers, self.movable_gpus, soon, view, self.facts, now, cfg)
        if asleep is None:
            plan = P.priority_plan(blocked, *args, self.memo, speed)
        else:
            plan = BT.boot_plan(blocked, *args, asleep, self.memo, speed)
        return [] if plan is None else self._orders(plan, now, cfg)

    def plan_short(
        self,
        blocked: Sequence[tuple[PendingJob, float]],
        view: ClusterView,
        running: RunningSet,
        now: float,
        cfg: PolicyConfig,
        speed: np.ndarray,
        most: int,
    ) -> list[MoveOrder]:
        """The short-wait rule's moves for this pass (``stages.short_wait.short_plans``: several
        plans, each node once, at most ``most`` moves); ``blocked``: (job, remaining runtime on
        the fastest model), most slowed first. The searches go through the book's memo."""
        movers, soon, movable = self._candidates(view, running, now, cfg)
        plans = SW.short_plans(
            blocked, movers, soon, view, self.facts, now, cfg, speed, most,
            search=self.memo, movable=movable,
        )  # fmt: skip
        for plan in plans:
            if plan.lease_until_s is not None:
                stopped = tuple(v.job_id for v in plan.victims if not v.shrink_to)
                self.leases[plan.for_job] = L.Lease(
                    plan.for_job, plan.node, plan.lease_until_s, stopped
                )
        return [mo for plan in plans for mo in self._orders(plan, now, cfg)]

    def end_leases(
        self, now: float, waiting: Callable[[str], bool], bound_s: float
    ) -> list[MoveOrder]:
        """The moves the leases that end now call for (``stages.lease.lease_move``), each
        recorded as ordered; every ended lease is forgotten. A victim still waiting keeps its
        room for another resume bound (the short job's save comes first)."""
        out = []
        for lease in L.due(self.leases.values(), now):
            del self.leases[lease.job_id]
            mo = L.lease_move(lease, self._running_free, waiting)
            if mo is None:
                continue
            for v in lease.victims:
                if v in self.rooms and waiting(v):
                    self.rooms[v] = (lease.node, now + bound_s)
            out.append(self.order(mo, now, bound_s))
        return out

    def _running_free(self, job_id: str) -> tuple[int, str] | None:
        """(attempt, node) of a running job that is not being moved, else None."""
        return None if job_id in self.moving else self.attempts.get(job_id)

    def plan_burst(
        self,
        blocked: Sequence[PendingJob],
        view: ClusterView,
        running: RunningSet,
        now: float,
        cfg: PolicyConfig,
        speed: np.ndarray | None = None,
    ) -> list[MoveOrder]:
        """The burst rule's moves for one blocked replica of ``blocked`` (``stages.burst``);
        ``speed``: the view's speed table, so a stopped victim resumes no slower."""
        movers, soon, _ = self._candidates(view, running, now, cfg)
        plan = B.burst_plan(blocked, movers, soon, view, self.facts, now, cfg, speed)
        if plan is None:
            return []
        self.last_burst_s = now
        return self._orders(plan, now, cfg)

    def _candidates(
        self, view: ClusterView, running: RunningSet, now: float, cfg: PolicyConfig
    ) -> tuple[dict[int, list], np.ndarray, np.ndarray]:
        """What every rule plans on: per node the running jobs not already moving, the whole
        GPUs free within the resume bound (``stages.resume.whole_free_within``) and the GPUs
        those movers hold per node (``stages.resume.movable_gpus``). Kept per node, and
        rebuilt (by the same expressions, so to the same values) only for the nodes where a
        job started, ended or was ordered to move since: a rebuild of every node at every
        change was a tenth of the rules' time. The caller reads them and changes nothing."""
        for i in self._dirty:
            d = self.movers.get(i)
            if d is None:
                self._free_movers.pop(i, None)
                self._free_movable[i] = 0.0
                continue
            rs = [r for jid, r in d.items() if jid not in self.moving]
            self._free_movers[i] = rs
            self._free_movable[i] = sum(P.gpus_held(r) for r in rs)
        self._dirty.clear()
        soon = soon_free(view, running, now, _ends_bound(cfg))
        return self._free_movers, soon, self._free_movable

    def _orders(self, plan: P.PriorityPlan, now: float, cfg: PolicyConfig) -> list[MoveOrder]:
        """A plan's moves, recorded as ordered (``order``)."""
        out = []
        to = dict(plan.rooms)
        for v in plan.victims:
            attempt, node = self.attempts[v.job_id]
            mo = MoveOrder(
                v.job_id,
                attempt,
                node,
                "preempt",
                plan.reason,
                for_job=plan.for_job,
                to_node=to.get(v.job_id, ""),
                shrink_to=v.shrink_to,
            )
            out.append(self.order(mo, now, cfg.preempt.resume_bound_s))
        return out
