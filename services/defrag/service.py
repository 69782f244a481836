"""The defragmenter's shell: ledger, nodes and the lifecycle in, move intents out.

Every ``interval_s`` it rebuilds the cluster as the ledger says it is, takes the jobs that
wait (highest priority first; the plan skips those that fit now), and asks
``libs.policy.stages.defrag.plan_moves`` (the definition the simulator runs too) for the
cheapest moves after which they fit, moving only what ``libs.policy.stages.preempt`` allows.
Each move becomes a ``MoveIntent`` on ``intents.defrag`` (rule 2: the placer checks and
commits it, or refuses it with a reason) and an audit record on ``decisions.defrag``. The
intent id names the attempt, so a restarted defragmenter that plans the same move again is
deduplicated by JetStream, and an attempt is asked for once per process.

It also exports the cluster's fragmentation as FGD measures it (``stages.frag``): the GPUs
free now that the workload seen so far could not use.

Restartable: nothing is kept that the KV buckets and the lifecycle stream do not rebuild (the
stream is replayed from its start; an ephemeral consumer).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from dataclasses import dataclass

from opentelemetry import trace
from prometheus_client import Counter, Gauge

from libs.bus.connection import Bus
from libs.bus.mirrors import ClusterMirror
from libs.bus.runtime import ServiceContext
from libs.clock import Clock
from libs.obs.health import Heartbeat
from libs.obs.jobspans import job_span, traceparent_of
from libs.obs.tracing import span_trace_id
from libs.policy.config import PolicyConfig
from libs.policy.ledger_view import ledger_cluster
from libs.policy.profiles import ProfileTable
from libs.policy.stages import defrag, frag
from libs.policy.stages import preempt as P
from libs.policy_io.policy_file import live_policy
from proto import subjects
from proto.decisions import Decision
from proto.events import LifecycleEvent
from proto.intents import MoveIntent
from proto.ledger import Allocation
from services.defrag.waiting import WaitingJobs

SERVICE = "defrag"
TRACER = trace.get_tracer(SERVICE)
INTENTS = Counter("mosaic_defrag_intents_total", "Move intents sent to the placer.")
ROUNDS = Counter("mosaic_defrag_rounds_total", "Planning rounds.")
FRAGMENTATION = Gauge(
    "mosaic_defrag_fragmentation_gpus",
    "Free GPUs the workload seen so far could not use (FGD's expected fragmentation).",
)


@dataclass(frozen=True)
class DefragSettings:
    interval_s: float = 5.0  # wall seconds between planning rounds
    blocked_per_round: int = 8  # blocked jobs a round plans for (highest priority first)
    wedged_after_s: float = 120.0


class Defragmenter:
    def __init__(
        self,
        bus: Bus,
        clock: Clock,
        log: object,
        settings: DefragSettings | None = None,
        *,
        policy: PolicyConfig | None = None,
        profiles: ProfileTable | None = None,
    ) -> None:
        self.bus, self.clock, self.log = bus, clock, log
        self.settings = settings or DefragSettings()
        self.policy = policy or live_policy()  # MOSAIC_POLICY_FILE, else the defaults
        self.profiles = profiles or ProfileTable.default()
        self.waiting = WaitingJobs()
        self.mirror = ClusterMirror(bus)  # nodes and ledger, revalidated
        self.nodes, self.ledger = self.mirror.nodes, self.mirror.ledger
        self.asked: set[str] = set()  # intent ids sent by this process
        self.heartbeat = Heartbeat("defrag loop", self.settings.wedged_after_s)

    async def start(self) -> None:
        await self.mirror.start()
        await self.bus.consume(
            subjects.STREAM_LIFECYCLE,
            f"{subjects.LIFECYCLE_PREFIX}.>",
            LifecycleEvent,
            self._on_event,
        )

    async def _on_event(self, ev: LifecycleEvent) -> None:
        self.waiting.apply(ev)

    async def run(self, stop: asyncio.Event) -> None:
        self.bus.health.register("defrag_loop", self.heartbeat.check)
        while not stop.is_set():
            self.heartbeat.beat()
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a NATS hiccup: the next round retries
                self.log.exception("round_failed", error=repr(exc))  # type: ignore[attr-defined]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.settings.interval_s)

    async def round(self) -> int:
        """One planning round; returns how many intents it sent."""
        ROUNDS.inc()
        if not self.nodes:
            return 0
        now = self.clock.now()
        view, by_id, facts = ledger_cluster(
            self.nodes, self.ledger, self.profiles, self.waiting.moved_at
        )
        running = list(by_id.values())
        if self.waiting.specs:
            work = frag.Workload.learn(self.waiting.specs.values())
            FRAGMENTATION.set(frag.cluster_fragmentation(view, work))
        blocked = self.waiting.blocked(self.settings.blocked_per_round)
        if not blocked or not running:
            return 0
        movable = P.movable_predicate(facts, view, running, now, self.policy)
        moves = defrag.plan_moves(
            view,
            running,
            blocked,
            now=now,
            cfg=self.policy,
            movable=movable,
            max_moves=self.policy.defrag.max_moves,
        )
        sent = 0
        for m in moves:
            alloc = self.ledger.get(m.job_id)
            if alloc is None:
                continue
            intent_id = f"defrag-{m.job_id}-{alloc.attempt}"
            if intent_id in self.asked:
                continue
            await self._ask(m, alloc, intent_id, now)
            self.asked.add(intent_id)
            sent += 1
        return sent

    async def _ask(self, m: defrag.Move, alloc: Allocation, intent_id: str, now: float) -> None:
        attrs = {"job": m.job_id, "for_job": m.for_job, "node": m.node_from, "to": m.node_to}
        with job_span(TRACER, "defrag.plan", "", **attrs) as span:
            intent = MoveIntent(
                id=intent_id,
                source=SERVICE,
                time=now,
                reason=m.reason,
                trace=traceparent_of(span),
                job_id=m.job_id,
                attempt=alloc.attempt,
                node=m.node_from,
                kind="preempt",
                for_job=m.for_job,
            )
            decision = Decision(
                job_id=m.job_id,
                time=now,
                action="preempt",
                service=SERVICE,
                node=m.node_from,
                reason=f"asked: {m.reason} (to {m.node_to}, for {m.for_job})",
                trace_id=span_trace_id(span),
                intent=intent_id,
            )
            await self.bus.publish(subjects.intents(SERVICE), intent, msg_id=intent_id)
            await self.bus.publish(
                subjects.decisions(SERVICE), decision, msg_id=f"decision-{intent_id}"
            )
        INTENTS.inc()
        self.log.info("intent", job=m.job_id, for_job=m.for_job, node=m.node_from)  # type: ignore[attr-defined]


async def main(ctx: ServiceContext) -> None:
    """``python -m services.defrag``: plan until ``ctx.stop``."""
    d = Defragmenter(ctx.bus, ctx.clock, ctx.log, settings_from_args(ctx.args))
    await d.start()
    await d.run(ctx.stop)


def settings_from_args(args: argparse.Namespace) -> DefragSettings:
    return DefragSettings(interval_s=getattr(args, "interval_s", DefragSettings.interval_s))
