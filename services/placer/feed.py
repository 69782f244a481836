"""Keeps the placer's ``libs.policy.core.Scheduler`` in step with what the placer knows.

Why incremental: a cycle used to rebuild the cluster view from the ledger and rank a fresh list
every time, so the live placer ran neither the simulator's rank epochs nor its memos, and a
cycle at 100,000 pending jobs cost a rebuild. Now the scheduler lives as long as the node set:
each cycle hands it only the jobs whose facts changed since the last cycle (``touch``: a
lifecycle event, a commit, a freed allocation) and the node holds (down, cordoned) that moved.

For each touched job the wanted state follows from the facts, never from history:
ended (or not a sound job) -> gone; in the ledger with a live attempt -> running with that
allocation; otherwise -> pending with its next attempt number. The scheduler is then moved to
that state with its own events (``queue_job``, ``start_job``, ``end_job``, ``cancel_job``),
the same ones the simulator feeds it. A node set that changes rebuilds the scheduler from the
ledger and the pending jobs (kept in their queue order); that is rare (nodes join or leave).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from libs.policy.config import PolicyConfig
from libs.policy.core import Scheduler
from libs.policy.profiles import ProfileTable
from libs.policy.types import PendingJob
from proto.jobs import JobSpec
from proto.ledger import Allocation, node_allocations
from proto.nodes import NodeSpec
from proto.validation_records import revalidate_allocation
from services.placer.tracker import JobTracker

# a temperature moves the thermal score term only when it moved this much: telemetry every 5 s
# would otherwise invalidate every memo of the view on every cycle
TEMP_STEP_C = 1.0


@dataclass(frozen=True)
class PowerFacts:
    """What the executors said of their nodes' power: the nodes not awake now (node ->
    "asleep" | "waking") and those that became awake (or refused to suspend) since the last
    cycle."""

    states: Mapping[str, str]
    woke: tuple[str, ...] = ()


class TouchingSet(set):
    """A set of job ids that tells the feed about each id added (``ended_here``: a job the
    placer ended itself leaves the scheduler in the next cycle, before its event echoes)."""

    def __init__(self, on_add) -> None:
        super().__init__()
        self._on_add = on_add

    def add(self, job_id: str) -> None:
        super().add(job_id)
        self._on_add(job_id)


def _same_allocation(a: Allocation, b: Allocation) -> bool:
    key = (a.node, a.gpu_indices, a.attempt, a.gpu_share, a.parts)
    return key == (b.node, b.gpu_indices, b.attempt, b.gpu_share, b.parts)


class SchedulerFeed:
    """The scheduler and the bookkeeping that feeds it (see the module docstring)."""

    def __init__(self, cfg: PolicyConfig, profiles: ProfileTable) -> None:
        self.cfg = cfg
        self.profiles = profiles
        self.sched: Scheduler | None = None
        self._nodes: tuple[NodeSpec, ...] = ()
        self._by_id: dict[str, NodeSpec] = {}
        self._touched: set[str] = set()
        self._temps: dict[str, float] = {}
        self.rebuilds = 0
        self.holds_changed = False  # whether the last sync moved a node hold
        self._never_checked = False  # queued jobs checked against the settled node set

    def reset(self) -> None:
        """Rebuild from the facts at the next sync (the ledger was reloaded)."""
        self.sched = None

    def touch(self, job_id: str) -> None:
        """The job's facts changed: look at it in the next ``sync``."""
        self._touched.add(job_id)

    def sync(
        self,
        *,
        nodes: Mapping[str, NodeSpec],
        tracker: JobTracker,
        ledger: Mapping[str, Allocation],
        gone: Set[str],
        holds: Mapping[str, set[str]],
        temps: Mapping[str, float],
        now: float,
        settled: bool,
        power: PowerFacts | None = None,
        first: Sequence[str] = (),
    ) -> tuple[Scheduler | None, list[JobSpec]]:
        """Bring the scheduler up to date. Returns it (None while no node is known) and the
        pending jobs no node could ever hold (to refuse; only once the node set ``settled``).
        ``first``: touched jobs to queue before the rest, in this order (a scale order's
        replicas, as the simulator queues them); the rest go in id order."""
        ordered = tuple(nodes[k] for k in sorted(nodes))
        if not ordered:
            self.sched = None
            return None, []
        self._touched |= tracker.changed
        tracker.changed.clear()
        if self.sched is None or ordered != self._nodes:
            self._rebuild(ordered, tracker, ledger, gone, now)
        sched = self.sched
        assert sched is not None
        never: list[JobSpec] = []
        ahead = [j for j in dict.fromkeys(first) if j in self._touched]
        for job in ahead + sorted(self._touched.difference(ahead)):
            self._sync_job(sched, job, tracker, ledger, gone, now, settled, never)
        self._touched.clear()
        if settled and not self._never_checked:  # jobs queued while nodes were still joining
            self._never_checked = True
            never += [j.spec for j in list(sched.queue) if not sched.can_ever_place(j.spec)]
        self.holds_changed = self._sync_holds(sched, holds)
        if power is not None:
            self.holds_changed |= self._sync_power(sched, power, now)
        self._sync_temps(sched, temps)
        return sched, never

    # ----- jobs ----------------------------------------------------------------------------
    @staticmethod
    def _wanted(
        job: str,
        tracker: JobTracker,
        ledger: Mapping[str, Allocation],
        gone: Set[str],
        nodes: Mapping[str, NodeSpec],
    ) -> Allocation | PendingJob | None:
        spec = tracker.specs.get(job)
        if spec is None or job in gone or tracker.is_terminal(job):
            return None
        alloc = ledger.get(job)
        if alloc is not None and not tracker.holds_nothing(job, alloc.attempt):
            return (
                alloc
                if all(a.node in nodes for a in node_allocations(alloc))  # a gang's every part
                and not revalidate_allocation(alloc, nodes[alloc.node], key=job)
                else None
            )  # a forged entry (GPU 99) holds nothing and is no placement either
        return PendingJob(
            spec,
            tracker.enqueued_at.get(job, spec.submit_time or 0.0),
            attempt=tracker.next_attempt(job),
            progress=tracker.progress.get(job, 0.0),
        )

    def _sync_job(
        self,
        sched: Scheduler,
        job: str,
        tracker: JobTracker,
        ledger: Mapping[str, Allocation],
        gone: Set[str],
        now: float,
        settled: bool,
        never: list[JobSpec],
    ) -> None:
        want = self._wanted(job, tracker, ledger, gone, self._by_id)
        moved = tracker.moved_at.get(job)
        if isinstance(want, PendingJob) and moved is not None:  # checkpointed: as it moved
            want = sched.moved_job(want, moved)
        held = sched.holds(job)
        queued = sched.queue.get(job)
        if want is None:
            if held is not None or queued is not None:
                sched.cancel_job(job, now)
            return
        if isinstance(want, Allocation):
            if held is not None and _same_allocation(held, want):
                return
            if held is not None:
                sched.end_job(job, now)
            with contextlib.suppress(ValueError):  # overlaps another entry: a forgery, skipped
                sched.start_job(job, want, tracker.specs[job], now)
            return
        if held is not None:
            sched.end_job(job, now)
        if queued == want:
            return
        if queued is not None:
            sched.cancel_job(job, now)
        if settled and not sched.can_ever_place(want.spec):
            never.append(want.spec)
            return
        sched.queue_job(want)

    def _rebuild(
        self,
        nodes: tuple[NodeSpec, ...],
        tracker: JobTracker,
        ledger: Mapping[str, Allocation],
        gone: Set[str],
        now: float,
    ) -> None:
        """A fresh scheduler for a new node set: running jobs from the ledger, then pending
        jobs in their old queue order (their insertion order breaks ties), then the rest."""
        old = self.sched
        order: list[str] = []
        if old is not None:
            seq = old.queue.seq()
            rows = sorted(range(len(old.queue)), key=lambda r: seq[r])
            order = [old.queue[r].spec.id for r in rows]
        sched = Scheduler(nodes, cfg=self.cfg, profiles=self.profiles, now=now)
        sched.moves.moved_at.update(tracker.moved_at)  # the move rate limit outlives a rebuild
        self.sched, self._nodes = sched, nodes
        self._by_id = {n.id: n for n in nodes}
        self.rebuilds += 1
        self._temps = {}
        self._never_checked = False
        seen = set(order)
        for job in sorted(ledger):
            self._sync_job(sched, job, tracker, ledger, gone, now, False, [])
        for job in order + [j for j in tracker.specs if j not in seen]:
            if job not in ledger:
                self._sync_job(sched, job, tracker, ledger, gone, now, False, [])

    # ----- nodes ---------------------------------------------------------------------------
    @staticmethod
    def _sync_holds(sched: Scheduler, holds: Mapping[str, set[str]]) -> bool:
        """``holds``: why -> the nodes held for that reason now (down, cordoned, ...). True
        when a hold moved (a pass is due: a released node may take a waiting job)."""
        index = sched.view.index
        moved = False
        for why, nodes in holds.items():
            have = sched.cordoned(why)
            for n in nodes - have:
                if n in index:
                    sched.set_cordoned(n, why, True)
                    moved = True
            for n in have - nodes:
                sched.set_cordoned(n, why, False)
                moved = True
        return moved

    @staticmethod
    def _sync_power(sched: Scheduler, facts: PowerFacts, now: float) -> bool:
        """Take the nodes' word on their power where the scheduler thinks otherwise (see
        ``core.Scheduler.power_fact``). True when a node woke (a pass is due)."""
        index = sched.view.index
        woke = False
        for node in facts.woke:
            if node in index and sched.power_state(node) != "awake":
                sched.power_fact(node, "awake", now)
                woke = True
        for node, state in facts.states.items():
            if node in index and state != "awake" and sched.power_state(node) == "awake":
                sched.power_fact(node, state, now)
        return woke

    def _sync_temps(self, sched: Scheduler, temps: Mapping[str, float]) -> None:
        for node, t in temps.items():
            last = self._temps.get(node)
            if node in sched.view.index and (last is None or abs(t - last) >= TEMP_STEP_C):
                self._temps[node] = t
                sched.set_temp(node, t)
