"""The placer's shell around ``reconcile``: executor reports in, lost allocations requeued.

Why a job that completes normally is never requeued: its executor publishes the terminal event
moments after the job leaves its reports, while a loss needs several reports over two report
intervals (about 10 s); and before requeueing, the placer reads the lifecycle stream up to its
current end and checks the tracker again, so a terminal event published in that window is seen
first. If the catch-up cannot be proven (NATS slow), nothing is requeued this round. (An
executor that published terminal events before dropping the attempt from its reports would make
this strict rather than a matter of seconds.) A mixin of ``Placer``.

Node power (issue 13): the reports also carry each node's power state, folded into
``node_power`` (``services.placer.power.NodePower``). A node that said it is suspending or
asleep, or is booting before its ``ready_at``, is expected to be silent: it is not counted
down (its jobs are not requeued, it is not cordoned), and its asleep telemetry is no reading.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from prometheus_client import Counter, Gauge

from libs.bus.connection import Bus, Consumer
from libs.bus.refusals import refused
from libs.bus.replay import wait_caught_up
from libs.clock import Clock
from proto import subjects
from proto.commands import KillCommand
from proto.events import Cancelled, Preempted
from proto.ledger import Allocation, node_allocations
from proto.nodes import ExecutorReport, NodeSpec, TelemetrySample
from proto.validation_records import revalidate_report, revalidate_sample
from services.placer.power import NodePower
from services.placer.reconcile import Reconciler
from services.placer.tracker import JobTracker

NODES_DOWN = Gauge("mosaic_placer_nodes_down", "Nodes whose executor stopped reporting.")
REQUEUED = Counter(
    "mosaic_placer_requeued_total",
    "Allocations given up because their node no longer runs them.",
    ["why"],
)
STALE = Counter(
    "mosaic_placer_stale_attempts_total",
    "Attempts a node reported running that the ledger does not hold there.",
)
CATCH_UP_S = 5.0  # how long a requeue may wait for the lifecycle consumer (wall s)


class NodeWatch:
    bus: Bus
    clock: Clock
    log: object
    ledger: dict[str, Allocation]
    nodes: dict[str, NodeSpec]
    temps: dict[str, float]
    tracker: JobTracker
    reconciler: Reconciler
    _lifecycle: Consumer
    _told_stale: set[tuple[str, int]]
    _requeue: Callable[[Allocation, str], Awaitable[Preempted | Cancelled]]
    _free_ended: Callable[[], Awaitable[None]]
    _kick: asyncio.Event
    active: bool  # the Placer's property

    @property
    def node_power(self) -> NodePower:
        """Each node's power state from its reports (created on first use: the mixin has no
        constructor of its own)."""
        power = self.__dict__.get("_node_power")
        if power is None:
            power = self.__dict__["_node_power"] = NodePower()
        return power

    async def _on_telemetry(self, sample: TelemetrySample) -> None:
        """The hottest GPU of a known node, from a sound sample (a -300 degree reading would
        make the node look like the coolest place to put a job)."""
        if sample.asleep:
            return  # an asleep node's GPUs are cold because they are off: no reading
        node = self.nodes.get(sample.node)
        errors = revalidate_sample(sample, node) if node is not None else []
        if node is not None and sample.gpus and not refused(self.bus, "telemetry", errors):
            self.temps[sample.node] = max(g.temp_c for g in sample.gpus)

    async def _on_report(self, report: ExecutorReport) -> None:
        if refused(self.bus, "report", revalidate_report(report), node=report.node[:64]):
            return
        change = self.node_power.on_report(report)
        if change is not None:
            self.log.info("node_power", node=report.node, old=change.old, new=change.new.state)
        news = self.reconciler.on_report(report, time.monotonic())
        if news.came_up:
            self.log.info("node_up", node=report.node, boot_id=report.boot_id)
            NODES_DOWN.set(len(self.reconciler.down))
            self._kick.set()
        if news.rebooted:
            self.log.info("executor_restarted", node=report.node, boot_id=report.boot_id)
        for job, attempt in news.stale:
            alloc = self.ledger.get(job)
            if (job, attempt) in self._told_stale or (
                alloc is not None
                and alloc.attempt == attempt
                and report.node in {a.node for a in node_allocations(alloc)}  # a gang's part
            ):
                continue  # started but its Started event not read yet, or already told
            STALE.inc()
            if self.active and self._superseded(job, attempt):
                self._told_stale.add((job, attempt))
                self.log.warning("stale_attempt", job=job, attempt=attempt, node=report.node)
                await self.bus.publish(
                    subjects.node_command(report.node, "kill"),
                    KillCommand(
                        job_id=job, reason="superseded: requeued", attempt=attempt, silent=True
                    ),
                    msg_id=f"stop-stale-{job}-{attempt}",
                )

    def _superseded(self, job: str, attempt: int) -> bool:
        """True when the lifecycle says this attempt is over for the placer: requeued (a later
        attempt is due or placed) or the job ended. An attempt whose Started we have not read
        yet is not (the ledger check above); neither is an unknown job."""
        t = self.tracker
        if not t.known(job):
            return False
        return t.holds_nothing(job, attempt) or t.next_attempt(job) - 1 > attempt

    def down_nodes(self) -> set[str]:
        """Refresh which nodes are down (logging changes); the cycle cordons them."""
        known = set(self.nodes) | {a.node for a in self.ledger.values()}
        known -= self.node_power.quiet(self.clock.now())  # asleep, not failed
        went, back = self.reconciler.refresh_down(known, time.monotonic())
        for node in sorted(went):
            silent = self.reconciler.down[node]
            self.log.warning("node_down", node=node, silent_s=round(silent, 1))
        for node in sorted(back):
            self.log.info("node_up", node=node)
        NODES_DOWN.set(len(self.reconciler.down))
        return set(self.reconciler.down)

    def sleeping_nodes(self) -> set[str]:
        """Nodes that cannot take a job now (suspending, asleep, waking): the cycle cordons
        them beside ``down_nodes()``. A run sent to one is refused with ``Preempted`` and the
        job would come straight back to it otherwise."""
        return self.node_power.asleep() | set(self.node_power.waking())

    async def _reconcile(self) -> int:
        """Requeue the allocations ``reconcile`` calls lost; returns how many. Call under the
        placer's lock, while active."""
        if not self.reconciler.lost(self.ledger, time.monotonic()):
            return 0
        if not await wait_caught_up(
            self.bus, self._lifecycle, subjects.STREAM_LIFECYCLE, timeout_s=CATCH_UP_S
        ):
            self.log.warning("reconcile_deferred", hint="lifecycle consumer not caught up")
            return 0
        done = 0
        for lost in self.reconciler.lost(self.ledger, time.monotonic()):
            alloc = self.ledger.get(lost.job_id)
            if (
                not self.active
                or alloc is None
                or alloc.attempt != lost.attempt
                or self.tracker.holds_nothing(lost.job_id, lost.attempt)
            ):
                continue  # ended meanwhile (its event was in the stream), or not ours to do
            ev = await self._requeue(alloc, lost.reason)
            self.tracker.apply(ev)  # free it now; the echo from the stream is a no-op
            self.reconciler.on_event(ev, time.monotonic())
            REQUEUED.labels(lost.kind).inc()
            self.log.warning("requeued", job=lost.job_id, node=lost.node, reason=lost.reason)
            done += 1
        if done:
            await self._free_ended()
        return done
