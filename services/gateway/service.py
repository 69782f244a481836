"""Wiring of the gateway: bus subscriptions that feed the read models, the two publishes it owns,
and the HTTP server.

Why the read models are rebuilt from the streams on every start (an ephemeral consumer, no
durable): the gateway must be killable at any moment and come back with the same view (rule 4).
Why from a snapshot: a replay from the first message grows with the cluster's history and, once
streams have retention, misses what aged out; so the jobs and decisions models are saved to the
Object Store every ``every_events`` events or ``every_s`` seconds and on a clean stop
(``libs.bus.snapshot``), and a start loads them and replays only what came after.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from libs.bus.refusals import refused
from libs.bus.runtime import env_float
from libs.bus.snapshot import (
    DEFAULT_EVERY_EVENTS,
    DEFAULT_EVERY_S,
    SnapshotStore,
    Snapshotter,
    ensure_snapshot_bucket,
)
from libs.obs.jobspans import traceparent_of
from proto import subjects
from proto.decisions import Decision
from proto.events import LifecycleEvent, Submitted
from proto.jobs import CancelRequest, JobSpec
from proto.ledger import Allocation
from proto.nodes import ExecutorReport, NodeSpec, TelemetrySample
from proto.tenants import TenantRecord
from proto.validation import FieldError, sound_id
from proto.views import JobView
from services.gateway import cordon_api
from services.gateway.api import GUARD_KEY, build_app
from services.gateway.auth import AuthConfigError, Authenticator, authenticator
from services.gateway.decisions_view import DecisionsModel
from services.gateway.httpserver import (
    BODY_TIMEOUT_S,
    DEFAULT_HTTP_PORT,
    HEADER_TIMEOUT_S,
    GatewayRunner,
    HttpTimeouts,
)
from services.gateway.jobs_view import (
    DEFAULT_KEEP_EVENTS,
    DEFAULT_MAX_FINISHED,
    DEFAULT_RETENTION_S,
    JobsModel,
)
from services.gateway.nodes_view import NodesModel
from services.gateway.producers import Producers
from services.gateway.profiles_api import ProfilesModel
from services.gateway.services_api import ServicesModel

SERVICE = "gateway"
REPLAY_WAIT_S = 30.0  # serve anyway after this long, with a warning: better late than down
DUPLICATE_WAIT_S = 2.0  # how long a duplicate submit waits for the read model to show the job
SNAPSHOT_JOBS = f"{SERVICE}.jobs"  # object names in the snapshots bucket
SNAPSHOT_DECISIONS = f"{SERVICE}.decisions"
NO_ID = FieldError("job_id", "not a sound id")


@dataclass(frozen=True)
class ReadModelConfig:
    """How the read models are bounded and snapshotted (defaults: see the constants' modules).

    Environment: MOSAIC_SNAPSHOTS (0 = off), MOSAIC_SNAPSHOT_EVERY_EVENTS,
    MOSAIC_SNAPSHOT_EVERY_S, MOSAIC_JOB_EVENTS_KEPT, MOSAIC_JOB_RETENTION_S,
    MOSAIC_JOB_RETENTION_MAX."""

    snapshots: bool = True
    every_events: int = DEFAULT_EVERY_EVENTS
    every_s: float = DEFAULT_EVERY_S
    keep_events: int = DEFAULT_KEEP_EVENTS
    retention_s: float = DEFAULT_RETENTION_S
    max_finished: int = DEFAULT_MAX_FINISHED

    @classmethod
    def from_env(cls) -> ReadModelConfig:
        return cls(
            snapshots=os.environ.get("MOSAIC_SNAPSHOTS", "1") not in ("0", "false", "no"),
            every_events=int(env_float("MOSAIC_SNAPSHOT_EVERY_EVENTS", str(DEFAULT_EVERY_EVENTS))),
            every_s=env_float("MOSAIC_SNAPSHOT_EVERY_S", str(DEFAULT_EVERY_S)),
            keep_events=int(env_float("MOSAIC_JOB_EVENTS_KEPT", str(DEFAULT_KEEP_EVENTS))),
            retention_s=env_float("MOSAIC_JOB_RETENTION_S", str(DEFAULT_RETENTION_S)),
            max_finished=int(env_float("MOSAIC_JOB_RETENTION_MAX", str(DEFAULT_MAX_FINISHED))),
        )


class Gateway:
    """The bus side of the gateway: read models in, ``jobs.submit``/``jobs.cancel`` out."""

    def __init__(
        self,
        bus: Any,
        clock: Any,
        log: Any,
        tracer: Any,
        auth: Authenticator,
        config: ReadModelConfig | None = None,
    ) -> None:
        self.bus = bus
        self.clock = clock
        self.log = log
        self.tracer = tracer
        self.auth = auth
        self.tenants_kv: Any = None
        self.cordons_kv: Any = None  # KV cordons, opened by start (services.gateway.cordon_api)
        self.profiles = ProfilesModel(bus)  # the profiler's table (services.gateway.profiles_api)
        self.services = ServicesModel()  # inference services (services.gateway.services_api)
        self.config = config or ReadModelConfig()
        self.jobs = JobsModel(
            keep_events=self.config.keep_events,
            retention_s=self.config.retention_s,
            max_finished=self.config.max_finished,
        )
        self.nodes = NodesModel(refuse=lambda record, errors: refused(bus, record, errors))
        self.decisions = DecisionsModel()
        self.jobs.on_expire = self.decisions.forget
        self.events_handled = 0  # LIFECYCLE messages handled since start (not our own echoes)
        self.decisions_handled = 0
        self._lifecycle: Any = None
        self.submitting: set[str] = set()  # ids between our jobs.submit and Submitted publishes
        self.snapshotters: dict[str, Snapshotter] = {}

    async def start(self) -> None:
        """Restore the read models from their snapshots, then subscribe everything they need
        (from the message after each snapshot). Idempotent topology first."""
        await self.bus.ensure_topology()
        snapshots = self.config.snapshots
        if snapshots:
            try:
                await ensure_snapshot_bucket(self.bus)
            except Exception as exc:  # e.g. no permission: serve from a full replay anyway
                self.log.warning("snapshots_unavailable", error=repr(exc))
                snapshots = False
        self._lifecycle = await self._follow(
            SNAPSHOT_JOBS,
            subjects.STREAM_LIFECYCLE,
            subjects.STREAM_LIFECYCLE_SUBJECTS[0],
            LifecycleEvent,
            self._on_event,
            self.jobs,
            snapshots,
        )
        await self._follow(
            SNAPSHOT_DECISIONS,
            subjects.STREAM_DECISIONS,
            subjects.STREAM_DECISIONS_SUBJECTS[0],
            Decision,
            self._on_decision,
            self.decisions,
            snapshots,
        )
        self.jobs.expire(self.clock.now())
        nodes_kv = await self.bus.kv(subjects.KV_NODES, NodeSpec)
        await nodes_kv.watch(self._on_node)
        ledger_kv = await self.bus.kv(subjects.KV_LEDGER, Allocation)
        await ledger_kv.watch(self._on_allocation)
        self.cordons_kv = await cordon_api.follow(self.bus, self.nodes)  # KV cordons (issue 13)
        self.profiles = await ProfilesModel(self.bus).follow()  # KV profiles (issue 15)
        await self.services.follow(self.bus)  # KV services and load.* (issue 16)
        await self.bus.subscribe(subjects.TELEMETRY_ALL, TelemetrySample, self._on_sample)
        await self.bus.subscribe(subjects.EXECUTOR_REPORTS_ALL, ExecutorReport, self._on_report)
        # tenants before serving: a token issued before a restart must work on the first request
        self.tenants_kv = await self.bus.kv(subjects.KV_TENANTS, TenantRecord)
        await self.tenants_kv.watch(self._on_tenant)

    async def _follow(
        self,
        key: str,
        stream: str,
        subject: str,
        type_: Any,
        handler: Any,
        model: Any,
        snapshots: bool,
    ) -> Any:
        """Consume all of ``stream`` into ``model``, from its snapshot on when there is one."""
        start_seq = None
        store = SnapshotStore(self.bus, key, stream)
        if snapshots:
            restored = await store.restore(model.load)
            start_seq = restored.start_seq
        consumer = await self.bus.consume(
            stream,
            subject,
            type_,
            handler,
            durable=None,
            deliver_all=True,
            opt_start_seq=start_seq,
        )
        if snapshots:
            self.snapshotters[key] = Snapshotter(
                store,
                consumer,
                model.encode,
                every_events=self.config.every_events,
                every_s=self.config.every_s,
                saved_seq=(start_seq or 1) - 1,
            ).start()
        return consumer

    async def stop(self) -> None:
        """A clean stop: save each read model once more, so the next start replays nothing."""
        for snapshotter in self.snapshotters.values():
            await snapshotter.stop(final=True)

    # --- inputs ------------------------------------------------------------------------------

    async def _on_event(self, event: LifecycleEvent) -> None:
        self.events_handled += 1
        if refused(self.bus, "lifecycle", [] if sound_id(event.job_id) else [NO_ID]):
            return  # no job could have that id: it would pend here forever
        self.jobs.apply(event)
        self.jobs.expire(self.clock.now())
        if (s := self.snapshotters.get(SNAPSHOT_JOBS)) is not None:
            s.note()

    async def _on_decision(self, decision: Decision) -> None:
        self.decisions_handled += 1
        self.decisions.apply(decision)
        self.services.decision(decision)  # a scale order: its service's last reason
        if (s := self.snapshotters.get(SNAPSHOT_DECISIONS)) is not None:
            s.note()

    async def _on_node(self, node_id: str, spec: NodeSpec | None) -> None:
        self.nodes.put_spec(node_id, spec)

    async def _on_allocation(self, job_id: str, alloc: Allocation | None) -> None:
        self.nodes.put_allocation(job_id, alloc)

    async def _on_sample(self, sample: TelemetrySample) -> None:
        self.nodes.put_sample(sample, self.clock.now())

    async def _on_report(self, report: ExecutorReport) -> None:
        self.nodes.put_report(report)  # the node's power state

    async def _on_tenant(self, name: str, record: TenantRecord | None) -> None:
        self.auth.put(name, record)

    # --- outputs -----------------------------------------------------------------------------

    async def submit(self, spec: JobSpec) -> tuple[JobView, bool]:
        """Publish an admitted job; (its view, True when the bus already had this id).

        ``jobs.submit`` first, then ``Submitted``, both deduplicated by id: a producer retrying
        after a failure between the two publishes completes the pair instead of making a second
        job.
        """
        self.submitting.add(spec.id)  # the bus consumer (producers.py) sees our jobs.submit too
        try:
            new = await self.bus.publish(subjects.SUBJECT_SUBMIT, spec, msg_id=spec.id)
            when = spec.submit_time or self.clock.now()  # the trace: the caller's span (libs.obs)
            event = Submitted(job_id=spec.id, time=when, spec=spec, trace=traceparent_of())
            await self.bus.publish(
                subjects.lifecycle(spec.id), event, msg_id=f"submitted-{spec.id}"
            )
        finally:
            self.submitting.discard(spec.id)  # no await until the event is applied below
        if new:
            self.jobs.apply(event)  # answer reads at once; the stream's copy is then a no-op
            self.log.info("job_submitted", job_id=spec.id, tenant=spec.tenant, gpus=spec.gpus)
            view = self.jobs.get(spec.id)
            assert view is not None
            return view, False
        view = await self._await_job(spec.id, DUPLICATE_WAIT_S)
        if view is None:
            # the bus has this id but our read model does not show it yet: answer "retry",
            # never fold in this caller's copy, which may name another tenant than the job the
            # bus holds (a tenant's duplicate would otherwise pass for the job's owner)
            raise TimeoutError(f"job {spec.id!r} is known to the bus but not visible yet")
        return view, True

    async def cancel(self, job_id: str, reason: str) -> None:
        req = CancelRequest(job_id=job_id, reason=reason, time=self.clock.now())
        await self.bus.publish(subjects.SUBJECT_CANCEL, req, msg_id=f"cancel-{job_id}")
        self.log.info("job_cancel_requested", job_id=job_id, reason=reason)

    async def _await_job(self, job_id: str, timeout_s: float) -> JobView | None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while (view := self.jobs.get(job_id)) is None:
            if asyncio.get_running_loop().time() >= deadline:
                return None
            await asyncio.sleep(0.02)
        return view

    def connected(self) -> bool:
        return bool(self.bus.nc.is_connected)

    async def caught_up(self) -> bool:
        """True once every LIFECYCLE message that existed is folded in (or dead-lettered)."""
        info = await self._lifecycle.sub.consumer_info()
        return info.num_pending == 0 and info.num_ack_pending == 0

    async def wait_caught_up(self, timeout_s: float) -> bool:
        """Wait until the LIFECYCLE replay is done (a duplicate submit is then recognised and
        GET answers the full history). False after ``timeout_s``."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not await self.caught_up():
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True


async def serve(
    gw: Gateway, host: str, port: int, timeouts: HttpTimeouts | None = None
) -> web.AppRunner:
    """Start the HTTP server; the caller cleans the runner up on shutdown.

    Slow clients are cut off (``services.gateway.httpserver``): a connection without a full
    request head for ``timeouts.header_s`` is closed, and so is one idle that long between
    requests (aiohttp's keep-alive timer, set to the same, is the second line of it); what
    the HTTP parser refuses is answered in JSON (``GatewayRunner``).
    """
    timeouts = timeouts or HttpTimeouts()
    app = build_app(gw, timeouts)
    runner = GatewayRunner(app, access_log=None, keepalive_timeout=timeouts.header_s)
    await runner.setup()
    assert runner.server is not None
    app[GUARD_KEY].watch(runner.server)
    await web.TCPSite(runner, host, port).start()
    return runner


async def main(ctx: Any) -> None:
    """config -> read models -> replay -> HTTP -> wait for stop -> drain."""
    host = getattr(ctx.args, "http_host", None) or os.environ.get("MOSAIC_HTTP_HOST", "127.0.0.1")
    port = getattr(ctx.args, "http_port", None)
    port = DEFAULT_HTTP_PORT if port is None else port
    try:
        auth = authenticator(ctx.args, ctx.log)
    except AuthConfigError as exc:
        ctx.log.error("http_auth_config", error=str(exc))
        raise
    config = getattr(ctx.args, "read_models", None) or ReadModelConfig.from_env()
    gw = Gateway(ctx.bus, ctx.clock, ctx.log, ctx.tracer, auth, config)
    await gw.start()
    if not await gw.wait_caught_up(REPLAY_WAIT_S):
        ctx.log.warning("lifecycle_replay_slow", jobs=len(gw.jobs), waited_s=REPLAY_WAIT_S)
    ctx.log.info("read_model_ready", jobs=len(gw.jobs), nodes=len(gw.nodes.specs))
    await Producers(gw).start()  # bus submissions, once the read model is whole; Bus.close stops it
    timeouts = HttpTimeouts(
        header_s=getattr(ctx.args, "http_header_timeout_s", None) or HEADER_TIMEOUT_S,
        body_s=getattr(ctx.args, "http_body_timeout_s", None) or BODY_TIMEOUT_S,
    )
    runner = await serve(gw, host, port, timeouts)
    ctx.log.info("gateway_listening", url=f"http://{host}:{port}/")
    try:
        await ctx.stop.wait()
    finally:
        await runner.cleanup()
        await gw.stop()
