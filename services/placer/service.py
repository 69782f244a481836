"""The placer's shell: triggers in, ledger writes and commands out, only while holding the lease.

Every replica follows the lifecycle stream (so a standby is warm); only the lease holder runs
the scheduler (``libs.policy.core.Scheduler``, kept in step by ``feed``), commits allocations
(``create``: a key that exists was placed already, which is what makes a restart safe), frees
the allocations of ended or preempted jobs, handles cancels and, on taking over, resends what a
crashed predecessor may have left half done. Every replica also follows the executors' reports;
the active one requeues allocations no node runs any more and cordons nodes that stopped
reporting (``nodewatch``, ``reconcile``). The lease loop lives in ``leadership``, the outgoing
messages in ``announce``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Mapping

from opentelemetry import trace
from prometheus_client import Gauge, Histogram

from libs.bus.connection import Bus, Consumer
from libs.bus.lease import Lease, LeaseRecord
from libs.bus.profile_watch import ProfileFollower
from libs.bus.refusals import refused
from libs.bus.replay import wait_caught_up
from libs.bus.runtime import ServiceContext
from libs.bus.tasks import cancel_and_wait
from libs.clock import Clock
from libs.obs.health import Heartbeat
from libs.policy.config import PolicyConfig
from libs.policy.profiles import ProfileTable
from libs.policy.warmup import warm_up
from libs.policy_io.policy_file import live_policy
from proto import subjects
from proto.events import LifecycleEvent, Preempted, Submitted, is_terminal
from proto.intents import Intent
from proto.jobs import CancelRequest
from proto.ledger import Allocation
from proto.nodes import ExecutorReport, NodeSpec, TelemetrySample
from proto.validation import describe
from proto.validation_records import revalidate_node_spec
from services.placer.announce import Announcer
from services.placer.cancels import Cancels
from services.placer.commit import Committer
from services.placer.cordons import Cordons
from services.placer.cycle import (
    INVALID,
    Refuse,
)
from services.placer.feed import SchedulerFeed, TouchingSet
from services.placer.leadership import Leadership
from services.placer.ledger_gc import purge_ledger_markers
from services.placer.moves import MoveCommitter
from services.placer.nodewatch import NodeWatch
from services.placer.power import OwedPower
from services.placer.reconcile import Reconciler
from services.placer.scaling import ScaleDriver
from services.placer.settings import PlacerSettings, settings_from_args
from services.placer.snapshot import seed_reconciler, tracker_snapshots
from services.placer.stepping import run_stepped
from services.placer.tracker import JobTracker

LEASE_NAME = "placer"

ACTIVE = Gauge("mosaic_placer_active", "1 while this replica holds the placer lease.")
LEDGER_SIZE = Gauge("mosaic_placer_ledger_allocations", "Allocations in the ledger.")
CYCLE_SECONDS = Histogram(
    "mosaic_placer_cycle_seconds",
    "Wall seconds of one placement cycle (decision and commits).",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)


class Placer(Committer, MoveCommitter, Announcer, NodeWatch, Cancels, ScaleDriver):
    def __init__(
        self,
        bus: Bus,
        clock: Clock,
        log: object,
        tracer: trace.Tracer,
        settings: PlacerSettings | None = None,
        *,
        policy: PolicyConfig | None = None,
        profiles: ProfileTable | None = None,
    ) -> None:
        self.bus = bus
        self.clock = clock
        self.log = log
        self.tracer = tracer
        self.settings = settings or PlacerSettings()
        self.holder = self.settings.holder_id()
        self.policy = policy or live_policy()  # MOSAIC_POLICY_FILE, else the defaults
        self.profiles = profiles or ProfileTable.default()
        self.tracker = JobTracker()
        self.snapshots = tracker_snapshots(bus, self.settings.snapshots)  # services.placer.snapshot
        self.ledger: dict[str, Allocation] = {}
        self.nodes: dict[str, NodeSpec] = {}
        self.temps: dict[str, float] = {}
        # the scheduler both drivers run, kept in step with the facts below (services.placer.feed)
        policy = dataclasses.replace(self.policy, power_saving=self.settings.power_saving)
        self.feed = SchedulerFeed(policy, self.profiles)
        # Failed/Cancelled we published, before they echo back (each leaves the scheduler)
        self.ended_here: set[str] = TouchingSet(self.feed.touch)
        self.cancelling: set[str] = set()  # running jobs we sent a kill for
        self.killed_in_cycle: set[str] = set()  # ... of them, those since the last cycle began
        self.next_tick_s: float | None = None  # the next instant the scheduler is owed
        self._pass_due = True  # something happened since the last pass
        self._nodes_changed = time.monotonic()
        self._last_purge = time.monotonic()  # the first purge comes one purge_every_s in
        self._kick = asyncio.Event()
        self._lock = asyncio.Lock()
        self._active = False
        self._cancels: Consumer | None = None
        self._intents: Consumer | None = None
        self._init_moves()  # services.placer.moves
        self._init_scaling()  # services.placer.scaling: inference services (issue 16)
        self.placed_count = 0  # commits by this replica (tests and logs)
        self._unannounced: set[str] = set()  # committed, but Placed/run not yet published
        self.power_owed = OwedPower()  # decided power commands not yet taken by NODECMD
        self.lease: Lease | None = None
        self.leadership: Leadership | None = None
        self._warming: asyncio.Task | None = None
        self.reconciler = Reconciler(self.settings.reconcile, now=time.monotonic())
        self._told_stale: set[tuple[str, int]] = set()
        self.heartbeat = Heartbeat("placer cycle loop", self.settings.wedged_after_s)

    # --- start-up --------------------------------------------------------------------------
    def _warmed(self, task: asyncio.Task) -> None:
        """A warm-up that failed only costs the first cycle its loading: say so, go on."""
        if not task.cancelled() and task.exception() is not None:
            self.log.warning("warm_up_failed", error=repr(task.exception()))

    async def start(self) -> None:
        """Follow nodes, telemetry, queue pokes and the lifecycle stream (from the tracker's
        snapshot on); wait for the replay."""
        # load the pass's compiled loops in the background while we catch up, so the first
        # cycle after a restart does not pay for it (libs.policy.warmup)
        self._warming = asyncio.create_task(asyncio.to_thread(warm_up, self.policy, self.profiles))
        self._warming.add_done_callback(self._warmed)
        self.ledger_kv = await self.bus.kv(subjects.KV_LEDGER, Allocation)
        nodes_kv = await self.bus.kv(subjects.KV_NODES, NodeSpec)
        leases_kv = await self.bus.kv(subjects.KV_LEASES, LeaseRecord)
        self.lease = Lease(
            leases_kv, LEASE_NAME, self.holder, self.settings.lease_ttl_s, on_lost=self._on_lost
        )
        # one watch delivers the current nodes, then every change: no gap between a snapshot
        # and the updates in which a node could vanish unseen
        await nodes_kv.watch(self._on_node)
        await ProfileFollower(self.bus, self.profiles, self._on_profiles).start()
        self.cordons = await Cordons(on_change=self._on_cordon).start(self.bus)
        await self._start_scaling()  # KV services and load.* (services.placer.scaling)
        await self.bus.subscribe(subjects.TELEMETRY_ALL, TelemetrySample, self._on_telemetry)
        await self.bus.subscribe(subjects.EXECUTOR_REPORTS_ALL, ExecutorReport, self._on_report)
        t = self.tracker
        self._lifecycle = await self.snapshots.follow(
            f"{subjects.LIFECYCLE_PREFIX}.>", LifecycleEvent, self._on_event, t.load, t.encode
        )
        await self._catch_up()

    async def _catch_up(self) -> None:
        if not await wait_caught_up(self.bus, self._lifecycle, subjects.STREAM_LIFECYCLE):
            self.log.warning("replay_incomplete", hint="acting on what was replayed so far")

    async def _on_node(self, key: str, value: NodeSpec | None) -> None:
        if value is None or refused(self.bus, "node", revalidate_node_spec(value, key), key=key):
            self.nodes.pop(key, None)
        else:
            self.nodes[key] = value
        self._nodes_changed = time.monotonic()
        self._pass_due = True  # a node joined, left or changed: what fits may have changed
        self._kick.set()

    async def _on_profiles(self, table: ProfileTable, version: int) -> None:
        """The profiler's newest table (issue 15): the next cycle ranks, places and sends
        runtimes with it; running jobs keep the ends estimated at their start."""
        async with self._lock:
            self.profiles = table
            self.feed.profiles = table
            if self.feed.sched is not None:
                self.feed.sched.use_profiles(table)
        self.log.info("profiles_updated", version=version)
        self._pass_due = True
        self._kick.set()

    def _on_cordon(self) -> None:
        self._pass_due = True  # an uncordoned node may take a waiting job now
        self._kick.set()

    async def _on_event(self, ev: LifecycleEvent) -> None:
        self.tracker.apply(ev)  # the feed hands the job's new facts to the scheduler
        self.reconciler.on_event(ev, time.monotonic())
        if is_terminal(ev):
            self.cancelling.discard(ev.job_id)
        if isinstance(ev, Submitted | Preempted) or is_terminal(ev):
            self._pass_due = True  # new work, or resources to free (the cycle does it)
            self._kick.set()

    @property
    def waiting(self) -> Mapping[str, str]:
        """Job -> why it waits, as last told: the scheduler's own record (never a copy)."""
        sched = self.feed.sched
        return sched.why.told if sched is not None else {}

    # --- the lease -------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self._active and self.lease is not None and self.lease.is_held

    def _on_lost(self) -> None:
        self._active = False
        ACTIVE.set(0)
        self.log.warning("placer_standby", reason="lease lost")

    async def _take_over(self) -> None:
        """Become active: catch up, load the ledger, finish what the last holder left."""
        await self._catch_up()
        async with self._lock:
            entries = await self.ledger_kv.items()
            self.ledger = {k: e.value for k, e in entries.items()}
            self.feed.reset()  # the scheduler restarts from this ledger
            self.power_owed.clear()  # ... and from the nodes' power, not our old decisions
            self.moves_owed.clear()
            seed_reconciler(self.reconciler, self.ledger, self.tracker)  # Started in a snapshot
            self._active = True
            ACTIVE.set(1)
            await self._free_ended()
            resent = 0
            down = self.down_nodes()
            for job, alloc in list(self.ledger.items()):
                if job in self._unannounced or not self.tracker.placed_seen(job, alloc.attempt):
                    await self._publish_placed(alloc)
                if alloc.node in down:
                    continue  # the first cycle requeues it
                if not self.tracker.started_seen(job, alloc.attempt):
                    await self._publish_run(alloc)
                    resent += 1
            self._unannounced.clear()
            LEDGER_SIZE.set(len(self.ledger))
        self._cancels = await self.bus.consume(
            subjects.STREAM_JOBS,
            subjects.SUBJECT_CANCEL,
            CancelRequest,
            self._on_cancel,
            durable="placer-cancel",
        )
        self._intents = await self.bus.consume(  # the defragmenter's and thermal guard's
            subjects.STREAM_INTENTS,
            f"{subjects.INTENTS_PREFIX}.>",
            Intent,
            self._on_intent,
            durable=subjects.CONSUMER_INTENTS,
        )
        self.log.info("placer_active", holder=self.holder, ledger=len(self.ledger), resent=resent)
        self._kick.set()

    async def _step_down(self) -> None:
        self._active = False
        ACTIVE.set(0)
        if self._cancels is not None:
            await self._cancels.stop()
            self._cancels = None
        if self._intents is not None:
            await self._intents.stop()
            self._intents = None

    # --- the cycle -------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Hold or wait for the lease and run cycles until ``stop``; then hand the lease back.

        The lease task and this loop are health checks: a dead lease task or a loop that made
        no turn for ``wedged_after_s`` turns ``/healthz`` 503, so a supervisor restarts us."""
        assert self.lease is not None
        self.leadership = Leadership(self.lease, self._take_over, self._step_down, self.log)
        lease_task = self.leadership.start(stop)
        health = self.bus.health
        health.register("placer_lease", self.leadership.check)
        health.register("placer_cycle", self.heartbeat.check)
        try:
            if getattr(self.clock, "stepped", False):
                await run_stepped(self, stop)  # a cycle per step, when the controller says
            else:
                await self._run_cycles(stop)
        except BaseException as exc:
            self.heartbeat.dead(repr(exc))
            raise
        finally:
            if stop.is_set():  # a clean stop is not a failure; a crash stays reported
                health.unregister("placer_lease")
                health.unregister("placer_cycle")
            await cancel_and_wait(lease_task)
            await self._step_down()
            with contextlib.suppress(Exception):
                await self.lease.release()

    async def _run_cycles(self, stop: asyncio.Event) -> None:
        """Cycle on every trigger (debounced) and every ``tick_s``, while active."""
        while not stop.is_set():
            self.heartbeat.beat()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), timeout=self.settings.tick_s)
            if stop.is_set():
                break
            await asyncio.sleep(self.settings.debounce_s)
            self._kick.clear()
            if self.active:
                await self.guarded_cycle()

    async def guarded_cycle(self) -> int:
        """A cycle whose failure (a NATS hiccup) is logged: the next trigger or tick retries."""
        try:
            return await self.cycle()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.log.exception("cycle_failed", error=repr(exc))
            await asyncio.sleep(0.5)
            return 0

    async def cycle(self) -> int:
        """One placement cycle; returns how many jobs were placed."""
        async with self._lock:
            if not self.active:
                return 0
            t0 = time.perf_counter()
            self.killed_in_cycle.clear()
            await self._free_ended()
            if time.monotonic() - self._last_purge >= self.settings.purge_every_s:
                self._last_purge = time.monotonic()
                await purge_ledger_markers(self.ledger_kv, self.log, self.settings.purge_after_s)
            down = self.down_nodes()
            await self._reconcile()
            await self._announce_unannounced()
            for spec, errors in self.tracker.invalid_jobs():  # unsound Submitted: see tracker
                if spec.id not in self.ended_here:
                    await self._refuse(Refuse(spec, f"{INVALID}: {describe(errors)}"))
            now = self.clock.now()
            self._take_holds(now)  # the thermal guard's holds, before the holds sync
            sched = await self._sync_feed(down, now)
            if sched is None:
                return 0
            await self._answer_intents(sched, now)
            added = await self._scale(sched, now)  # the scaler's orders, before the tick
            if added is not None:  # the added replicas queued in order, the stopped ones gone
                sched = await self._sync_feed(down, now, added)
                assert sched is not None
            due = self._pass_due
            self._pass_due = False
            budget = self.settings.explain_per_cycle
            before = sched.view.copy() if due and budget and len(sched.queue) else None
            decisions = sched.tick(now, woke=due)
            self.next_tick_s = decisions.next_tick_s
            # owed before the commits: the scheduler already counts on them (OwedPower)
            warm = set(decisions.warm)  # the audit says which wakes refill the warm reserve
            wake = [n for n in decisions.wake if n not in warm]
            self.power_owed.owe(decisions.suspend, wake, now, "power saving")
            self.power_owed.owe((), decisions.warm, now, "power saving: warm reserve refill")
            self.moves_owed += decisions.moves  # likewise: the scheduler counts them as under way
            placed = await self._commit_all(sched, decisions, before, now)
            await self._commit_moves(now)
            await self.power_owed.send(self.bus)
            await self._tell_reasons(sched)
            LEDGER_SIZE.set(len(self.ledger))
            CYCLE_SECONDS.observe(time.perf_counter() - t0)
            return placed


async def main(ctx: ServiceContext) -> None:
    """``python -m services.placer``: follow, wait for the lease, place until ``ctx.stop``."""
    placer = Placer(ctx.bus, ctx.clock, ctx.log, ctx.tracer, settings_from_args(ctx.args))
    await placer.start()
    try:
        await placer.run(ctx.stop)
    finally:
        await placer.snapshots.stop()  # a clean stop saves: the next start replays nothing
