"""The placer's shell: triggers in, ledger writes and commands out, only while holding the lease.

Every replica follows the lifecycle stream (so a standby is warm); only the lease holder reads
the ranked queue, commits allocations (``create``: a key that exists was placed already, which is
what makes a restart safe), frees the allocations of ended or preempted jobs, handles cancels and,
on taking over, resends what a crashed predecessor may have left half done.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import time
import uuid
from dataclasses import dataclass

from opentelemetry import trace
from prometheus_client import Counter, Gauge, Histogram

from libs.bus.connection import Bus, Consumer
from libs.bus.errors import KeyExists
from libs.bus.lease import Lease, LeaseRecord
from libs.bus.replay import wait_caught_up
from libs.bus.runtime import ServiceContext
from libs.clock import Clock
from libs.obs.tracing import span_trace_id
from libs.policy.cadence import BackfillCadence
from libs.policy.config import PolicyConfig
from libs.policy.profiles import ProfileTable
from libs.policy.types import PendingJob
from libs.policy.warmup import warm_up
from proto import subjects
from proto.commands import KillCommand, RunCommand
from proto.decisions import Decision, RankedQueue
from proto.events import Cancelled, Failed, LifecycleEvent, Placed, Preempted, is_terminal
from proto.jobs import CancelRequest
from proto.ledger import Allocation
from proto.nodes import NodeSpec, TelemetrySample
from proto.validation import describe
from services.placer.cycle import INVALID, Assign, Refuse, plan_cycle
from services.placer.tracker import JobTracker

SERVICE = "placer"
LEASE_NAME = "placer"

ACTIVE = Gauge("mosaic_placer_active", "1 while this replica holds the placer lease.")
LEDGER_SIZE = Gauge("mosaic_placer_ledger_allocations", "Allocations in the ledger.")
PLACED = Counter("mosaic_placer_placements_total", "Allocations committed.")
REFUSED = Counter("mosaic_placer_refusals_total", "Jobs failed because no node can hold them.")
CYCLE_SECONDS = Histogram(
    "mosaic_placer_cycle_seconds",
    "Wall seconds of one placement cycle (decision and commits).",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)


@dataclass(frozen=True)
class PlacerSettings:
    lease_ttl_s: float = 5.0  # a crashed active is replaced after at most this (wall s)
    tick_s: float = 2.0  # a cycle at least this often (wall s), even without a trigger
    debounce_s: float = 0.05  # triggers within this window make one cycle
    settle_s: float = 2.0  # the node set must be unchanged this long before a never-fits refusal
    holder: str = ""

    def holder_id(self) -> str:
        return self.holder or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Placer:
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
        self.policy = policy or PolicyConfig.default()
        self.profiles = profiles or ProfileTable.default()
        self.tracker = JobTracker()
        self.ledger: dict[str, Allocation] = {}
        self.nodes: dict[str, NodeSpec] = {}
        self.temps: dict[str, float] = {}
        self.ended_here: set[str] = set()  # Failed/Cancelled we published, before they echo back
        self.waiting: dict[str, str] = {}  # job -> why it waits (Slurm-style reason), last cycle
        # backfill below a blocked head at most every policy.backfill_interval_s (policy time),
        # the same cadence the simulator keeps; cycles run every tick_s, so it comes round
        self._cadence = BackfillCadence(self.policy.backfill_interval_s)
        self._told_waiting: dict[str, str] = {}  # the reason last published as a wait Decision
        self._nodes_changed = time.monotonic()
        self._kick = asyncio.Event()
        self._lock = asyncio.Lock()
        self._active = False
        self._cancels: Consumer | None = None
        self.placed_count = 0  # commits by this replica (tests and logs)
        self._unannounced: set[str] = set()  # committed, but Placed/run not yet published
        self.lease: Lease | None = None
        self._warming: asyncio.Task | None = None

    # --- start-up --------------------------------------------------------------------------
    def _warmed(self, task: asyncio.Task) -> None:
        """A warm-up that failed only costs the first cycle its loading: say so, go on."""
        if not task.cancelled() and task.exception() is not None:
            self.log.warning("warm_up_failed", error=repr(task.exception()))

    async def start(self) -> None:
        """Follow nodes, telemetry, queue pokes and the lifecycle stream; wait for the replay."""
        # load the pass's compiled loops in the background while we catch up, so the first
        # cycle after a restart does not pay for it (libs.policy.warmup)
        self._warming = asyncio.create_task(asyncio.to_thread(warm_up, self.policy, self.profiles))
        self._warming.add_done_callback(self._warmed)
        self.ledger_kv = await self.bus.kv(subjects.KV_LEDGER, Allocation)
        self.queue_kv = await self.bus.kv(subjects.KV_QUEUE, RankedQueue)
        nodes_kv = await self.bus.kv(subjects.KV_NODES, NodeSpec)
        leases_kv = await self.bus.kv(subjects.KV_LEASES, LeaseRecord)
        self.lease = Lease(
            leases_kv, LEASE_NAME, self.holder, self.settings.lease_ttl_s, on_lost=self._on_lost
        )
        self.nodes = {k: e.value for k, e in (await nodes_kv.items()).items()}
        await nodes_kv.watch(self._on_node, include_current=False)
        await self.bus.subscribe(subjects.TELEMETRY_ALL, TelemetrySample, self._on_telemetry)
        await self.bus.subscribe(subjects.QUEUE_UPDATED, RankedQueue, self._on_poke)
        self._lifecycle = await self.bus.consume(
            subjects.STREAM_LIFECYCLE,
            f"{subjects.LIFECYCLE_PREFIX}.>",
            LifecycleEvent,
            self._on_event,
        )
        await self._catch_up()

    async def _catch_up(self) -> None:
        if not await wait_caught_up(self.bus, self._lifecycle, subjects.STREAM_LIFECYCLE):
            self.log.warning("replay_incomplete", hint="acting on what was replayed so far")

    async def _on_node(self, key: str, value: NodeSpec | None) -> None:
        if value is None:
            self.nodes.pop(key, None)
        else:
            self.nodes[key] = value
        self._nodes_changed = time.monotonic()
        self._kick.set()

    async def _on_telemetry(self, sample: TelemetrySample) -> None:
        if sample.gpus:
            self.temps[sample.node] = max(g.temp_c for g in sample.gpus)

    async def _on_poke(self, _: RankedQueue) -> None:
        self._kick.set()

    async def _on_event(self, ev: LifecycleEvent) -> None:
        self.tracker.apply(ev)
        if (is_terminal(ev) or isinstance(ev, Preempted)) and ev.job_id in self.ledger:
            self._kick.set()  # resources to free (the cycle does it, under the lock)

    # --- the lease -------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self._active and self.lease is not None and self.lease.is_held

    def _on_lost(self) -> None:
        self._active = False
        ACTIVE.set(0)
        self.log.warning("placer_standby", reason="lease lost")

    async def _lease_loop(self, stop: asyncio.Event) -> None:
        assert self.lease is not None
        while not stop.is_set():
            got = asyncio.create_task(self.lease.acquire())
            halt = asyncio.create_task(stop.wait())
            await asyncio.wait({got, halt}, return_when=asyncio.FIRST_COMPLETED)
            halt.cancel()
            if not got.done():
                got.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await got
                return
            got.result()
            try:
                await self._take_over()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log.exception("takeover_failed", error=repr(exc))
                await self._step_down()
                await asyncio.sleep(self.settings.lease_ttl_s / 3)
                continue
            lost = asyncio.create_task(self.lease.lost.wait())
            halt = asyncio.create_task(stop.wait())
            await asyncio.wait({lost, halt}, return_when=asyncio.FIRST_COMPLETED)
            lost.cancel()
            halt.cancel()
            await self._step_down()

    async def _take_over(self) -> None:
        """Become active: catch up, load the ledger, finish what the last holder left."""
        await self._catch_up()
        async with self._lock:
            entries = await self.ledger_kv.items()
            self.ledger = {k: e.value for k, e in entries.items()}
            self._active = True
            ACTIVE.set(1)
            await self._free_ended()
            resent = 0
            for job, alloc in list(self.ledger.items()):
                if job in self._unannounced or not self.tracker.placed_seen(job, alloc.attempt):
                    await self._publish_placed(alloc)
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
        self.log.info("placer_active", holder=self.holder, ledger=len(self.ledger), resent=resent)
        self._kick.set()

    async def _step_down(self) -> None:
        self._active = False
        ACTIVE.set(0)
        if self._cancels is not None:
            await self._cancels.stop()
            self._cancels = None

    # --- the cycle -------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Hold or wait for the lease and run cycles until ``stop``; then hand the lease back."""
        lease_task = asyncio.create_task(self._lease_loop(stop), name="placer:lease")
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._kick.wait(), timeout=self.settings.tick_s)
                if stop.is_set():
                    break
                await asyncio.sleep(self.settings.debounce_s)
                self._kick.clear()
                if not self.active:
                    continue
                try:
                    await self.cycle()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # NATS hiccup: the next trigger or tick retries
                    self.log.exception("cycle_failed", error=repr(exc))
                    await asyncio.sleep(0.5)
        finally:
            lease_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await lease_task
            await self._step_down()
            if self.lease is not None:
                with contextlib.suppress(Exception):
                    await self.lease.release()

    async def cycle(self) -> int:
        """One placement cycle; returns how many jobs were placed."""
        async with self._lock:
            if not self.active:
                return 0
            t0 = time.perf_counter()
            await self._free_ended()
            await self._announce_unannounced()
            for spec, errors in self.tracker.invalid_jobs():  # unsound Submitted: see tracker
                if spec.id not in self.ended_here:
                    await self._refuse(Refuse(spec, f"{INVALID}: {describe(errors)}"))
            entry = await self.queue_kv.get(subjects.KV_QUEUE_KEY)
            pending = self._pending(entry.value if entry else None)
            if not pending:
                self.waiting = {}
                self._told_waiting.clear()
                return 0
            settled = time.monotonic() - self._nodes_changed >= self.settings.settle_s
            now = self.clock.now()
            plan = plan_cycle(
                pending,
                list(self.nodes.values()),
                self.ledger,
                now=now,
                profiles=self.profiles,
                cfg=self.policy,
                temp_c=self.temps,
                refuse_never_fits=settled,
                backfill=self._cadence.take(now),
            )
            self.waiting = plan.waiting
            await self._explain_waiting()
            for r in plan.refuse:
                if not self.active:
                    break
                await self._refuse(r)
            placed = 0
            for a in plan.assign:
                if not self.active:  # lost the lease mid-cycle: the new holder decides
                    break
                placed += await self._commit(a)
            LEDGER_SIZE.set(len(self.ledger))
            CYCLE_SECONDS.observe(time.perf_counter() - t0)
            return placed

    def _pending(self, queue: RankedQueue | None) -> list[PendingJob]:
        if queue is None:
            return []
        out = []
        for e in queue.entries:
            job = e.spec.id
            if job in self.ledger or job in self.ended_here or self.tracker.is_terminal(job):
                continue
            out.append(
                PendingJob(
                    e.spec,
                    e.enqueued_at,
                    attempt=self.tracker.next_attempt(job),
                    progress=self.tracker.progress.get(job, 0.0),
                )
            )
        return out

    async def _explain_waiting(self) -> None:
        """A ``wait`` Decision each time a job's reason to wait changes (not every cycle), so
        ``mosaic explain`` can say why a job is pending without flooding the stream."""
        now = self.clock.now()
        news = {j: r for j, r in self.waiting.items() if self._told_waiting.get(j) != r}
        for job in [j for j in self._told_waiting if j not in self.waiting]:
            del self._told_waiting[job]
        if not news:
            return
        await asyncio.gather(
            *(
                self.bus.publish(
                    subjects.decisions(SERVICE),
                    Decision(
                        job_id=job,
                        time=now,
                        action="wait",
                        service=SERVICE,
                        reason=reason,
                    ),
                )
                for job, reason in news.items()
            )
        )
        self._told_waiting.update(news)

    async def _free_ended(self) -> None:
        """Delete the allocations of jobs that ended or whose attempt was preempted."""
        for job, alloc in list(self.ledger.items()):
            if self.tracker.holds_nothing(job, alloc.attempt):
                await self.ledger_kv.delete(job)
                del self.ledger[job]
                self.log.info("freed", job=job, node=alloc.node, attempt=alloc.attempt)

    async def _commit(self, a: Assign) -> int:
        job, alloc = a.allocation.job_id, a.allocation
        try:
            await self.ledger_kv.create(job, alloc)
        except KeyExists:  # placed already (by a predecessor): take the ledger's word for it
            e = await self.ledger_kv.get(job)
            if e is not None:
                self.ledger[job] = e.value
            return 0
        self.ledger[job] = alloc
        self._unannounced.add(job)  # until every message is out (a NATS error retries it)
        self.tracker.note_placed(job, alloc.attempt)
        PLACED.inc()
        self.placed_count += 1
        attrs = {"job": job, "node": alloc.node, "score": a.placement.score}
        with self.tracer.start_as_current_span("placer.place", attributes=attrs) as span:
            await self._publish_placed(alloc)
            decision = Decision(
                job_id=job,
                time=alloc.time,
                action="place",
                service=SERVICE,
                node=alloc.node,
                reason=f"score {a.placement.score:.3f}",
                candidates=a.candidates,
                trace_id=span_trace_id(span),
            )
            await asyncio.gather(
                self._publish_run(alloc, a.runtime_s, a.job.progress),
                self.bus.publish(
                    subjects.decisions(SERVICE),
                    decision,
                    msg_id=f"decision-place-{job}-{alloc.attempt}",
                ),
            )
        self._unannounced.discard(job)
        return 1

    async def _announce_unannounced(self) -> None:
        """Resend Placed and run for commits whose messages failed (same ids: no duplicates)."""
        for job in list(self._unannounced):
            alloc = self.ledger.get(job)
            if alloc is not None and not self.tracker.holds_nothing(job, alloc.attempt):
                await self._publish_placed(alloc)
                if not self.tracker.started_seen(job, alloc.attempt):
                    await self._publish_run(alloc)
            self._unannounced.discard(job)

    async def _refuse(self, r: Refuse) -> None:
        job = r.spec.id
        now = self.clock.now()
        REFUSED.inc()
        with self.tracer.start_as_current_span(
            "placer.refuse", attributes={"job": job, "reason": r.reason}
        ) as span:
            await self.bus.publish(
                subjects.lifecycle(job),
                Failed(job_id=job, time=now, reason=r.reason),
                msg_id=f"failed-{job}",
            )
            await self.bus.publish(
                subjects.decisions(SERVICE),
                Decision(
                    job_id=job,
                    time=now,
                    action="refuse",
                    service=SERVICE,
                    reason=r.reason,
                    filtered=r.filtered,
                    trace_id=span_trace_id(span),
                ),
                msg_id=f"decision-refuse-{job}",
            )
        self.ended_here.add(job)
        self.log.info("refused", job=job, reason=r.reason)

    async def _publish_placed(self, alloc: Allocation) -> None:
        ev = Placed(
            job_id=alloc.job_id,
            time=alloc.time,
            node=alloc.node,
            gpu_indices=alloc.gpu_indices,
            gpu_share=alloc.gpu_share,
            attempt=alloc.attempt,
        )
        await self.bus.publish(
            subjects.lifecycle(alloc.job_id), ev, msg_id=f"placed-{alloc.job_id}-{alloc.attempt}"
        )

    async def _publish_run(
        self, alloc: Allocation, runtime_s: float | None = None, progress: float | None = None
    ) -> None:
        if runtime_s is None:
            node = self.nodes.get(alloc.node)
            spec = alloc.spec
            if node is None or spec is None:
                self.log.error("cannot_resend_run", job=alloc.job_id, node=alloc.node)
                return
            runtime_s = self.profiles.covering([node]).runtime_s(spec, node.gpu_model)
        if progress is None:
            progress = self.tracker.progress.get(alloc.job_id, 0.0)
        cmd = RunCommand(allocation=alloc, runtime_s=runtime_s, progress=progress)
        await self.bus.publish(
            subjects.node_command(alloc.node, "run"),
            cmd,
            msg_id=f"run-{alloc.job_id}-{alloc.attempt}",
        )

    # --- cancels ---------------------------------------------------------------------------
    async def _on_cancel(self, req: CancelRequest) -> None:
        async with self._lock:
            job = req.job_id
            if self.tracker.is_terminal(job) or job in self.ended_here:
                return
            alloc = self.ledger.get(job)
            if alloc is not None:  # the executor stops it and answers Cancelled
                await self.bus.publish(
                    subjects.node_command(alloc.node, "kill"),
                    KillCommand(job_id=job, reason=req.reason),
                    msg_id=f"kill-{job}-{alloc.attempt}",
                )
                self.log.info("cancel_running", job=job, node=alloc.node)
                return
            if job not in self.tracker.specs:
                self.log.warning("cancel_unknown_job", job=job)
            await self.bus.publish(
                subjects.lifecycle(job),
                Cancelled(job_id=job, time=self.clock.now(), reason=req.reason),
                msg_id=f"cancelled-{job}",
            )
            self.ended_here.add(job)
            self.log.info("cancel_pending", job=job)


def settings_from_args(args: argparse.Namespace) -> PlacerSettings:
    d = PlacerSettings()
    return PlacerSettings(
        lease_ttl_s=getattr(args, "lease_ttl_s", d.lease_ttl_s),
        tick_s=getattr(args, "tick_s", d.tick_s),
        debounce_s=getattr(args, "debounce_s", d.debounce_s),
        settle_s=getattr(args, "settle_s", d.settle_s),
        holder=getattr(args, "holder", "") or "",
    )


async def main(ctx: ServiceContext) -> None:
    """``python -m services.placer``: follow, wait for the lease, place until ``ctx.stop``."""
    placer = Placer(ctx.bus, ctx.clock, ctx.log, ctx.tracer, settings_from_args(ctx.args))
    await placer.start()
    await placer.run(ctx.stop)
