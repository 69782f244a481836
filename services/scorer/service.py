"""The scorer's shell: lifecycle stream in, ranked queue out (KV ``queue``/``ranked`` + a poke).

Re-ranks shortly after every change (debounced: a burst of 200 submissions is one ranking, not
200) and every ``rescore_s`` because aging and deadlines move scores even when nothing happens.

The pending set restarts from its snapshot (``libs.bus.snapshot``, object ``scorer.pending``)
plus the lifecycle events after it, not from the stream's first message: a job pending for
longer than LIFECYCLE's retention is still known after a restart (its ``Submitted`` may be gone),
and a restart reads only what came after the last save (every N events or M seconds, and on a
clean stop). Nothing is published during the replay: ``Queued`` goes out from the ranking loop,
which starts once the replay caught up, and only for attempts the set has no ``Queued`` for.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import msgspec
from opentelemetry import trace
from prometheus_client import Gauge

from libs.bus.connection import Bus
from libs.bus.refusals import refused
from libs.bus.replay import wait_caught_up
from libs.bus.runtime import ServiceContext
from libs.bus.snapshot import SnapshotFollower, SnapshotSettings
from libs.clock import Clock
from libs.obs.health import Heartbeat
from libs.obs.jobspans import job_span
from libs.policy.config import REGIMES, PolicyConfig
from libs.policy.profiles import ProfileTable
from proto import subjects
from proto.decisions import RankedQueue
from proto.events import LifecycleEvent, Queued, Submitted
from proto.ledger import Allocation
from proto.nodes import NodeSpec
from proto.validation import FieldError, describe
from proto.validation_records import revalidate_allocation, revalidate_node_spec
from services.scorer.pending import PendingSet
from services.scorer.ranking import build_queue

QUEUE_LENGTH = Gauge("mosaic_scorer_queue_length", "Pending jobs in the ranked queue.")
REGIME = Gauge("mosaic_scorer_regime", "1 for the current load regime, else 0.", ["regime"])
LOAD = Gauge("mosaic_scorer_load", "Allocated GPU share of the cluster (0..1).")
RANK_SECONDS = Gauge("mosaic_scorer_rank_seconds", "Wall seconds of the last ranking.")
SNAPSHOT_KEY = "scorer.pending"  # the pending set's object in the snapshots bucket
TRACER = trace.get_tracer("scorer")


@dataclass(frozen=True)
class ScorerSettings:
    debounce_s: float = 0.1  # quiet time after a change before ranking
    max_delay_s: float = 1.0  # but never later than this after the first change
    rescore_s: float = 2.0  # wall seconds between rankings when nothing changes
    wedged_after_s: float = 120.0  # /healthz 503 when the ranking loop made no turn this long
    snapshots: SnapshotSettings = field(default_factory=SnapshotSettings)


class Scorer:
    def __init__(
        self,
        bus: Bus,
        clock: Clock,
        log: object,
        settings: ScorerSettings | None = None,
        *,
        policy: PolicyConfig | None = None,
        profiles: ProfileTable | None = None,
    ) -> None:
        self.bus = bus
        self.clock = clock
        self.log = log
        self.settings = settings or ScorerSettings()
        self.policy = policy or PolicyConfig.default()
        self.profiles = profiles or ProfileTable.default()
        self.pending = PendingSet(on_invalid=self._on_invalid)
        self.nodes: dict[str, NodeSpec] = {}
        self.ledger: dict[str, Allocation] = {}
        self.last_queue: RankedQueue | None = None
        self.snapshots = SnapshotFollower(
            bus, SNAPSHOT_KEY, subjects.STREAM_LIFECYCLE, self.settings.snapshots
        )
        self._dirty = asyncio.Event()
        self._last_change = 0.0
        self.heartbeat = Heartbeat("scorer ranking loop", self.settings.wedged_after_s)

    async def start(self) -> None:
        """Mirror nodes and ledger, restore the pending set from its snapshot, replay the
        lifecycle events after it, and wait until caught up."""
        self.queue_kv = await self.bus.kv(subjects.KV_QUEUE, RankedQueue)
        nodes_kv = await self.bus.kv(subjects.KV_NODES, NodeSpec)
        ledger_kv = await self.bus.kv(subjects.KV_LEDGER, Allocation)
        # one watch per bucket delivers the current values and then every change: a snapshot
        # followed by a separate watch would miss a key deleted in between, and the ranking
        # would count a freed allocation as held ("double booking") until the next restart
        await nodes_kv.watch(self._on_node)
        await ledger_kv.watch(self._on_alloc)
        consumer = await self.snapshots.follow(
            f"{subjects.LIFECYCLE_PREFIX}.>",
            LifecycleEvent,
            self._on_event,
            self.pending.load,
            self.pending.encode,
        )
        if not await wait_caught_up(self.bus, consumer, subjects.STREAM_LIFECYCLE):
            self.log.warning("replay_incomplete", hint="ranking with what was replayed so far")
        self.log.info("replayed", pending=len(self.pending), events=self.snapshots.handled)
        self._dirty.set()

    def _on_invalid(self, ev: Submitted, errors: list[FieldError]) -> None:
        """Kept out of the queue; the placer publishes its Failed (services.scorer.pending)."""
        self.log.warning("invalid_job_from_bus", job_id=ev.job_id, errors=describe(errors))

    async def _on_node(self, key: str, value: NodeSpec | None) -> None:
        if value is None or refused(self.bus, "node", revalidate_node_spec(value, key), key=key):
            self.nodes.pop(key, None)
        else:
            self.nodes[key] = value

    async def _on_alloc(self, key: str, value: Allocation | None) -> None:
        errs = [] if value is None else revalidate_allocation(value)
        if value is None or refused(self.bus, "allocation", errs, key=key):
            self.ledger.pop(key, None)
        else:
            self.ledger[key] = value

    async def _on_event(self, ev: LifecycleEvent) -> None:
        if self.pending.apply(ev):
            self._last_change = time.monotonic()
            self._dirty.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Rank after changes (debounced) and every ``rescore_s``, until ``stop``. The loop is a
        health check: no turn for ``wedged_after_s`` (or its death) turns ``/healthz`` 503."""
        self.bus.health.register("scorer_loop", self.heartbeat.check)
        try:
            await self._run(stop)
        except BaseException as exc:
            self.heartbeat.dead(repr(exc))
            raise

    async def _run(self, stop: asyncio.Event) -> None:
        s = self.settings
        while not stop.is_set():
            self.heartbeat.beat()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), timeout=s.rescore_s)
            if stop.is_set():
                return
            if self._dirty.is_set():
                first = time.monotonic()
                while time.monotonic() - self._last_change < s.debounce_s:
                    if time.monotonic() - first >= s.max_delay_s:
                        break
                    await asyncio.sleep(s.debounce_s / 2)
            self._dirty.clear()
            try:
                await self.rank_and_publish()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS hiccup: the next round retries
                self.log.exception("rank_failed", error=repr(exc))
                await asyncio.sleep(0.5)

    async def rank_and_publish(self) -> RankedQueue | None:
        """One ranking: emit ``Queued`` for newcomers, write the queue, poke the placer.
        Skips the write when the queue is and was empty."""
        jobs = list(self.pending.pending.values())
        if not jobs and self.last_queue is not None and not self.last_queue.entries:
            return None
        t0 = time.perf_counter()
        queue = build_queue(
            jobs,
            list(self.nodes.values()),
            list(self.ledger.values()),
            now=self.clock.now(),
            cfg=self.policy,
            profiles=self.profiles,
        )
        RANK_SECONDS.set(time.perf_counter() - t0)
        queue = fit_payload(queue, int(self.bus.nc.max_payload * 0.9))
        if len(queue.entries) < len(jobs):
            self.log.warning(
                "queue_truncated", pending=len(jobs), written=len(queue.entries), hint="max_payload"
            )
        await self.queue_kv.put(subjects.KV_QUEUE_KEY, queue)
        # the poke carries the header only: readers take the queue from KV
        poke = RankedQueue(time=queue.time, load=queue.load, regime=queue.regime)
        await self.bus.publish(subjects.QUEUE_UPDATED, poke, durable=False)
        self.last_queue = queue
        QUEUE_LENGTH.set(len(jobs))
        LOAD.set(queue.load)
        for r in REGIMES:
            REGIME.labels(r).set(1.0 if r == queue.regime else 0.0)
        return queue

    async def _emit_queued(self, queue: RankedQueue) -> None:
        wanted = self.pending.needs_queued_event
        new = [(i, e) for i, e in enumerate(queue.entries) if wanted(e.spec.id)]
        if not new:
            return

        async def one(rank: int, entry_score: float, job: str) -> None:
            attempt = self.pending.pending[job].attempt
            ev = Queued(job_id=job, time=queue.time, rank=rank + 1, score=entry_score)
            # the job's score decision, once per attempt (not per re-rank), in the job's trace
            trace = self.pending.trace_of(job)
            with job_span(
                TRACER,
                "scorer.score",
                trace,
                job=job,
                attempt=attempt,
                rank=rank + 1,
                score=entry_score,
                regime=queue.regime,
            ):
                await self.bus.publish(
                    subjects.lifecycle(job), ev, msg_id=f"queued-{job}-{attempt}"
                )
            self.pending.mark_queued(job)

        await asyncio.gather(*(one(i, e.score, e.spec.id) for i, e in new))


def fit_payload(queue: RankedQueue, max_bytes: int) -> RankedQueue:
    """The queue, cut to its best entries if its JSON would exceed ``max_bytes`` (NATS refuses
    larger messages). Why cutting the tail is safe: the placer works from the head, and the
    jobs cut off are still pending here and move up as the head drains."""
    size = len(msgspec.json.encode(queue))
    if size <= max_bytes or not queue.entries:
        return queue
    per_entry = size / len(queue.entries)
    keep = max(1, int(max_bytes / per_entry * 0.95))
    while keep > 1:
        cut = msgspec.structs.replace(queue, entries=queue.entries[:keep])
        if len(msgspec.json.encode(cut)) <= max_bytes:
            return cut
        keep = int(keep * 0.9)
    return msgspec.structs.replace(queue, entries=queue.entries[:1])


async def main(ctx: ServiceContext) -> None:
    """``python -m services.scorer``: run until ``ctx.stop``."""
    scorer = Scorer(ctx.bus, ctx.clock, ctx.log, settings_from_args(ctx.args))
    await scorer.start()
    try:
        await scorer.run(ctx.stop)
    finally:
        await scorer.snapshots.stop()  # a clean stop saves: the next start replays nothing


def settings_from_args(args: argparse.Namespace) -> ScorerSettings:
    return ScorerSettings(
        debounce_s=getattr(args, "debounce_s", ScorerSettings.debounce_s),
        rescore_s=getattr(args, "rescore_s", ScorerSettings.rescore_s),
        snapshots=getattr(args, "snapshots", None) or SnapshotSettings.from_env(),
    )
