"""The scorer's shell: lifecycle stream in, one admission ``Queued`` per attempt out, and the
queue's gauges.

What it owns: the admission score (the job's priority as of its queueing, shown to the user in
``mosaic queue`` and on the dashboard, and the ``scorer.score`` span of the job's trace, between
``gateway.submit`` and ``placer.place``) and the queue metrics (``mosaic_scorer_*``). What it no
longer owns: the queue's order. That is decided where placement happens, as Slurm's priority
plugin runs inside slurmctld and kube-scheduler's QueueSort is a plugin of the scheduler itself:
the placer's ``libs.policy.core.Scheduler`` reads its rank epoch at the pass's moment, in the
pass's state, which is what makes the simulator and the live placer decide the same. A ranked
list written here would be a second, older opinion of the order, and one KV value holding the
whole queue cannot grow with the cluster (issue 13: no single value or message holds the queue).

The loop runs shortly after every change (debounced: a burst of 200 submissions is one round,
not 200) and every ``rescore_s``, which refreshes the gauges (load moves without a lifecycle
event) and retries an announcement a NATS hiccup lost. A round scores only the newcomers.

The pending set restarts from its snapshot (``libs.bus.snapshot``, object ``scorer.pending``)
plus the lifecycle events after it, not from the stream's first message: a job pending for
longer than LIFECYCLE's retention is still known after a restart (its ``Submitted`` may be gone),
and a restart reads only what came after the last save (every N events or M seconds, and on a
clean stop). Nothing is published during the replay: ``Queued`` goes out from the loop, which
starts once the replay caught up, and only for attempts the set has no admission ``Queued`` for
(``PendingSet.needs_queued_event``), so a restart announces nothing twice; the message id
``queued-<job>-<attempt>`` makes a repeat in JetStream's duplicate window one message anyway.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from opentelemetry import trace
from prometheus_client import Gauge

from libs.bus.connection import Bus
from libs.bus.mirrors import ClusterMirror
from libs.bus.profile_watch import ProfileFollower
from libs.bus.replay import wait_caught_up
from libs.bus.runtime import ServiceContext
from libs.bus.snapshot import SnapshotFollower, SnapshotSettings
from libs.clock import Clock
from libs.obs.health import Heartbeat
from libs.obs.jobspans import job_span
from libs.policy.config import REGIMES, PolicyConfig
from libs.policy.profiles import ProfileTable
from libs.policy_io.policy_file import live_policy
from proto import subjects
from proto.events import LifecycleEvent, Queued, Submitted
from proto.validation import FieldError, describe
from services.scorer.admission import Admission, AdmissionScore, admission_scores
from services.scorer.pending import PendingSet

# the names deploy/ (Grafana, alerts) and docs/operations.md refer to
QUEUE_LENGTH = Gauge("mosaic_scorer_queue_length", "Pending jobs (the scorer's pending set).")
REGIME = Gauge("mosaic_scorer_regime", "1 for the current load regime, else 0.", ["regime"])
LOAD = Gauge("mosaic_scorer_load", "Allocated GPU share of the cluster (0..1).")
RANK_SECONDS = Gauge(
    "mosaic_scorer_rank_seconds", "Wall seconds of the last round's admission scoring."
)
SNAPSHOT_KEY = "scorer.pending"  # the pending set's object in the snapshots bucket
TRACER = trace.get_tracer("scorer")


@dataclass(frozen=True)
class ScorerSettings:
    debounce_s: float = 0.1  # quiet time after a change before a round
    max_delay_s: float = 1.0  # but never later than this after the first change
    rescore_s: float = 2.0  # wall seconds between rounds when nothing changes (the gauges)
    wedged_after_s: float = 120.0  # /healthz 503 when the loop made no turn this long
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
        self.policy = policy or live_policy()  # MOSAIC_POLICY_FILE, else the defaults
        self.profiles = profiles or ProfileTable.default()
        self.pending = PendingSet(on_invalid=self._on_invalid)
        self.mirror = ClusterMirror(bus)
        self.nodes, self.ledger = self.mirror.nodes, self.mirror.ledger
        self.last_round: Admission | None = None
        self.snapshots = SnapshotFollower(
            bus, SNAPSHOT_KEY, subjects.STREAM_LIFECYCLE, self.settings.snapshots
        )
        self._dirty = asyncio.Event()
        self._last_change = 0.0
        self.heartbeat = Heartbeat("scorer loop", self.settings.wedged_after_s)

    async def start(self) -> None:
        """Mirror nodes and ledger, restore the pending set from its snapshot, replay the
        lifecycle events after it, and wait until caught up."""
        await self.mirror.start()  # libs.bus.mirrors: one watch per bucket, revalidated
        await ProfileFollower(self.bus, self.profiles, self._on_profiles).start()
        consumer = await self.snapshots.follow(
            f"{subjects.LIFECYCLE_PREFIX}.>",
            LifecycleEvent,
            self._on_event,
            self.pending.load,
            self.pending.encode,
        )
        if not await wait_caught_up(self.bus, consumer, subjects.STREAM_LIFECYCLE):
            self.log.warning("replay_incomplete", hint="scoring with what was replayed so far")
        self.log.info("replayed", pending=len(self.pending), events=self.snapshots.handled)
        self._dirty.set()

    async def _on_profiles(self, table: ProfileTable, version: int) -> None:
        """The profiler's newest table (issue 15): the next round scores with it."""
        self.profiles = table
        self._dirty.set()

    def _on_invalid(self, ev: Submitted, errors: list[FieldError]) -> None:
        """Kept out of the pending set; the placer publishes its Failed (``pending``)."""
        self.log.warning("invalid_job_from_bus", job_id=ev.job_id, errors=describe(errors))

    async def _on_event(self, ev: LifecycleEvent) -> None:
        if self.pending.apply(ev):
            self._last_change = time.monotonic()
            self._dirty.set()

    async def run(self, stop: asyncio.Event) -> None:
        """A round after changes (debounced) and every ``rescore_s``, until ``stop``. The loop is
        a health check: no turn for ``wedged_after_s`` (or its death) turns ``/healthz`` 503."""
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
                await self.score_and_announce()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS hiccup: the next round retries
                self.log.exception("score_failed", error=repr(exc))
                await asyncio.sleep(0.5)

    async def score_and_announce(self) -> Admission:
        """One round: score the attempts not yet announced, publish their ``Queued``, set the
        gauges. The whole pending set is walked only for its tenants, when there are newcomers."""
        pending = self.pending.pending
        newcomers = self.pending.unannounced()
        t0 = time.perf_counter()
        admission = admission_scores(
            newcomers,
            list(self.nodes.values()),
            list(self.ledger.values()),
            now=self.clock.now(),
            cfg=self.policy,
            profiles=self.profiles,
            waiting_tenants={p.spec.tenant for p in pending.values()} if newcomers else (),
        )
        if newcomers:
            RANK_SECONDS.set(time.perf_counter() - t0)
        await self._announce(admission)
        self.last_round = admission
        QUEUE_LENGTH.set(len(self.pending))
        LOAD.set(admission.load)
        for r in REGIMES:
            REGIME.labels(r).set(1.0 if r == admission.regime else 0.0)
        return admission

    async def _announce(self, admission: Admission) -> None:
        now = self.clock.now()

        async def one(a: AdmissionScore) -> None:
            job, attempt = a.job.spec.id, a.job.attempt
            # no rank: the placer orders the queue
            ev = Queued(job_id=job, time=now, score=a.score, attempt=attempt)
            # the job's score decision, once per attempt, in the job's trace
            with job_span(
                TRACER,
                "scorer.score",
                self.pending.trace_of(job),
                job=job,
                attempt=attempt,
                score=a.score,
                regime=admission.regime,
            ):
                await self.bus.publish(
                    subjects.lifecycle(job), ev, msg_id=f"queued-{job}-{attempt}"
                )
            self.pending.mark_queued(job, attempt)

        await asyncio.gather(*(one(a) for a in admission.scores))


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
