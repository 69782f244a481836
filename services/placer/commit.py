"""How the placer turns a tick's decisions into facts: ledger entries, their announcements and
audit records, power commands, and the wait reasons it tells. A mixin of ``Placer`` (it reads
the placer's bus, tracer, ledger, tracker, feed and settings), apart so the service module
stays the shell: start-up, the lease and the cycle's order of steps.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from prometheus_client import Counter

from libs.bus.connection import Bus
from libs.bus.errors import KeyExists
from libs.obs.tracing import span_trace_id
from libs.policy.config import PolicyConfig
from libs.policy.core import Scheduler
from libs.policy.decisions import Decisions, Place
from libs.policy.profiles import ProfileTable
from proto import subjects
from proto.decisions import CandidateScore, Decision
from proto.ledger import Allocation
from proto.nodes import NodeSpec
from services.placer.announce import SERVICE
from services.placer.cycle import audit_candidates, chosen_only, never_fits_refusal
from services.placer.feed import PowerFacts, SchedulerFeed
from services.placer.moves import RESUME_DELAY
from services.placer.power import NodePower
from services.placer.settings import PlacerSettings
from services.placer.tracker import JobTracker

PLACED = Counter("mosaic_placer_placements_total", "Allocations committed.")


class Committer:
    bus: Bus
    tracer: trace.Tracer
    policy: PolicyConfig
    settings: PlacerSettings
    ledger: dict[str, Allocation]
    ledger_kv: object
    tracker: JobTracker
    feed: SchedulerFeed
    waiting: Mapping[str, str]
    placed_count: int
    _unannounced: set[str]
    node_power: NodePower
    log: Any
    active: bool  # the Placer's property
    reconciler: Any  # services.placer.reconcile.Reconciler
    nodes: dict[str, NodeSpec]
    temps: dict[str, float]
    ended_here: set[str]
    profiles: ProfileTable
    _nodes_changed: float
    _pass_due: bool
    _refuse: Any  # services.placer.announce
    _publish_placed: Any  # services.placer.announce
    _publish_run: Any

    async def _commit_all(self, sched: Scheduler, decisions: Decisions, before, now: float) -> int:
        """Commit the tick's placements in order; give back any that cannot be committed."""
        placed = 0
        explained = 0
        for k, p in enumerate(decisions.places):
            if not self.active:  # lost the lease mid-cycle: the new holder decides
                sched.unplace(p.allocation, now)
                continue
            if before is not None and explained < self.settings.explain_per_cycle:
                cands = audit_candidates(p, before, sched.profiles, self.policy)
                explained += 1
            else:
                cands = chosen_only(p.placement)
            if before is not None:
                before.allocate(p.allocation)
            try:
                committed = await self._commit(p, cands)
            except BaseException:
                self._settle_interrupted(sched, decisions.places[k:], now)
                raise
            if committed:
                sched.start_job(p.allocation.job_id, p.allocation, p.job.spec, now)
                placed += 1
                if p.job.resume_by is not None:  # a moved job resumes: how long it waited
                    requeued = p.job.resume_by - self.policy.preempt.resume_bound_s
                    RESUME_DELAY.observe(max(0.0, now - requeued))
            else:  # the ledger holds another allocation: the next sync takes the ledger's
                sched.unplace(p.allocation, now)
                self.feed.touch(p.allocation.job_id)
        return placed

    def _settle_interrupted(self, sched: Scheduler, places: Sequence[Place], now: float) -> None:
        """A commit raised (a NATS error: a stream electing a leader after a server died), so
        ``places`` (the failed one first) are booked by the pass (on the view, running in the
        scheduler) but neither confirmed nor undone.

        Why: a placement left so held its GPUs for good though no ledger entry had them, and
        its job, believed running, was never placed again: it stayed pending for ever, and so
        did any job needing that room. One whose ledger entry was written is committed (its
        ``Placed``/run are owed, ``_unannounced``): it is confirmed. The others are undone and
        wait again; the next cycle places them."""
        given_back = []
        for p in places:
            job = p.allocation.job_id
            if self.ledger.get(job) is p.allocation:
                sched.start_job(job, p.allocation, p.job.spec, now)
                continue
            sched.unplace(p.allocation, now)
            self.feed.touch(job)
            given_back.append(job)
        if given_back:
            self.log.warning("placements_given_back", jobs=given_back[:20], n=len(given_back))

    def power_facts(self) -> PowerFacts:
        """The nodes' own word on their power, for the scheduler (``feed.PowerFacts``): a node
        that refused to suspend is awake."""
        p = self.node_power
        states = {n: "asleep" for n in p.asleep()} | {n: "waking" for n in p.waking()}
        woke = [n for n, _ in p.awake_events()] + [n for n, _ in p.refusal_events()]
        return PowerFacts(states, tuple(woke))

    def node_holds(self, down: set[str], now: float) -> dict[str, set[str]]:
        """Why nodes are held out of placement now: down (a silent executor), cordoned (by an
        operator, ``services.placer.cordons``, or by a node label), hot (the thermal guard's
        hold intents, ``services.placer.moves``)."""
        cordoned = set(self.cordons.ids(self.nodes.values()))
        return {"down": down, "cordoned": cordoned, "hot": self.hot_nodes(now)}  # type: ignore[attr-defined]

    async def _tell_reasons(self, sched: Scheduler) -> None:
        """Publish the waits whose reason changed (a bounded number per cycle)."""
        news = sched.reason_changes(self.settings.reasons_per_cycle)
        if news:
            await self._explain_waiting(news, sched)

    async def _commit(self, p: Place, candidates: tuple[CandidateScore, ...]) -> bool:
        """Create the ledger entry of ``p`` and announce it; False when the ledger already
        holds this job (placed by a predecessor: its entry is taken instead)."""
        job, alloc = p.allocation.job_id, p.allocation
        try:
            await self.ledger_kv.create(job, alloc)
        except KeyExists:  # placed already (by a predecessor): take the ledger's word for it
            e = await self.ledger_kv.get(job)
            if e is not None:
                self.ledger[job] = e.value
                if not self.tracker.placed_seen(job, e.value.attempt):
                    # our own create whose reply a dying server lost, or a predecessor that
                    # stopped before announcing it: nobody else will send its Placed and run
                    self._unannounced.add(job)
            return False
        self.ledger[job] = alloc
        self._unannounced.add(job)  # until every message is out (a NATS error retries it)
        self.tracker.note_placed(job, alloc.attempt)
        PLACED.inc()
        self.placed_count += 1
        attrs = {"job": job, "node": alloc.node, "score": p.placement.score}
        with self._job_span("placer.place", job, attrs) as span:  # in the job's trace
            await self._publish_placed(alloc)
            decision = Decision(
                job_id=job,
                time=alloc.time,
                action="place",
                service=SERVICE,
                node=alloc.node,
                reason=f"score {p.placement.score:.3f}",
                candidates=candidates,
                trace_id=span_trace_id(span),
            )
            await asyncio.gather(
                self._publish_run(alloc, None, p.job.progress),
                self.bus.publish(
                    subjects.decisions(SERVICE),
                    decision,
                    msg_id=f"decision-place-{job}-{alloc.attempt}",
                ),
            )
        self._unannounced.discard(job)
        return True

    async def _sync_feed(
        self, down: set[str], now: float, first: Sequence[str] = ()
    ) -> Scheduler | None:
        """Bring the scheduler up to date with the placer's facts; refuse what never fits."""
        settled = time.monotonic() - self._nodes_changed >= self.settings.settle_s
        # a down node stays in the view, cordoned: nothing lands on it, and a job only it
        # could hold waits for it instead of being refused as never fitting
        sched, never = self.feed.sync(
            nodes=self.nodes,
            tracker=self.tracker,
            ledger=self.ledger,
            gone=self.ended_here,
            holds=self.node_holds(down, now),
            temps=self.temps,
            now=now,
            settled=settled,
            power=self.power_facts(),
            first=first,
        )
        self._pass_due |= self.feed.holds_changed  # a released node may take a waiting job
        for spec in never:
            if self.active:
                nodes = list(self.nodes.values())
                await self._refuse(never_fits_refusal(spec, nodes, self.profiles, self.policy))
        return sched

    async def _free_ended(self) -> None:
        """Delete the allocations of jobs that ended or whose attempt was preempted."""
        for job, alloc in list(self.ledger.items()):
            if self.tracker.holds_nothing(job, alloc.attempt):
                await self.ledger_kv.delete(job)
                del self.ledger[job]
                self.feed.touch(job)
                self.log.info("freed", job=job, node=alloc.node, attempt=alloc.attempt)

    async def _announce_unannounced(self) -> None:
        """Resend Placed and run for commits whose messages failed (same ids: no duplicates)."""
        for job in list(self._unannounced):
            alloc = self.ledger.get(job)
            if alloc is not None and not self.tracker.holds_nothing(job, alloc.attempt):
                await self._publish_placed(alloc)
                down = alloc.node in self.reconciler.down
                if not down and not self.tracker.started_seen(job, alloc.attempt):
                    await self._publish_run(alloc)
            self._unannounced.discard(job)
