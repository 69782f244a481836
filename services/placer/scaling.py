"""Inference services in the live placer (issue 16): definitions in, load in, the scaler's
orders applied before each tick, exactly as the simulator applies them.

Where the facts come from: a service's definition is the operator's or its tenant's, written
by the gateway into KV ``services`` (``POST /v1/services``; DESIGN rule 2, as cordons); the
placer only watches it, like ``cordons.Cordons``. The load is the service's own word, a
``LoadReport`` on ``load.<service>`` (core NATS: the newest report wins, as telemetry); one
that decodes but is unsound (``proto.inference.validate_report``: a report on ``load.a`` that
names service ``b`` included) goes to ``dlq.placer`` like one that does not decode, and the
placer goes on.

Why the placer publishes a replica's ``Submitted`` itself, and not the gateway: the scaler lives
in the scheduler the placer runs, and a burst must be answered by the same instant's pass
(``core_scale``: scale_step, queue the added replicas, then tick). A round trip through the
gateway would cost the burst a cycle, and the simulator cannot have one. The event goes to
``lifecycle.<replica>`` with ``Nats-Msg-Id`` ``submitted-<replica>`` (the gateway's form), so the
gateway's and scorer's read models see a replica like any job, and the tracker folds it at once
so this cycle's pass can place it. A replica id names its decision instant
(``proto.inference.replica_id``): a resend of the same decision is deduplicated by JetStream, a
later decision names new replicas, and none is ever submitted twice.

A stopped replica goes down the cancel path (``cancels``): a waiting one ends ``Cancelled`` at
once, a running one is killed by its executor, which answers ``Cancelled``; the reason starts
with "scaled down". Each order is a ``Decision`` (``scale_up`` / ``scale_down``) per replica.

After a restart (or a node-set change) the scheduler is rebuilt from the ledger and the
lifecycle, which rebuilds the autoscaler's replicas (its ``queued``/``started``); the services
and their newest reports are then told to the new scheduler before its first scale step. Only
the hysteresis memory is lost, which can only delay a scale-down.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import msgspec
from opentelemetry import trace
from opentelemetry.trace import Span
from prometheus_client import Counter

from libs.bus.connection import Bus
from libs.bus.refusals import refused
from libs.obs.jobspans import job_span, traceparent_of
from libs.obs.tracing import span_trace_id
from libs.policy.core import Scheduler
from libs.policy.scaling import ScaleOrder
from proto import subjects
from proto.decisions import Decision
from proto.events import Submitted
from proto.inference import InferenceService, LoadReport, validate_report, validate_service
from proto.jobs import CancelRequest, JobSpec
from proto.ledger import Allocation
from proto.service_views import SCALE_DOWN, SCALE_UP, SCALED_DOWN
from proto.validation import FieldError, describe
from services.placer.tracker import JobTracker

SERVICE = "placer"
SCALE_ORDERS = Counter(
    "mosaic_placer_scale_replicas_total",
    "Inference replicas the scaler added or stopped.",
    ["direction"],
)


def _definition_errors(key: str, svc: InferenceService) -> list[FieldError]:
    """A definition the scaler may run: sound (the gateway checked it; the bus is a trust
    boundary all the same) and stored under its own id."""
    errors = validate_service(svc)
    if svc.id != key:
        errors.append(FieldError("id", f"stored under {key!r}, names {svc.id!r}"))
    return errors


class ScaleDriver:
    """A mixin of ``Placer`` (see the module docstring)."""

    bus: Bus
    log: Any
    tracer: trace.Tracer
    tracker: JobTracker
    ledger: dict[str, Allocation]
    ended_here: set[str]
    _kick: asyncio.Event
    _pass_due: bool
    _cancel: Callable[..., Any]  # services.placer.cancels
    _job_span: Callable[..., AbstractContextManager[Span]]  # services.placer.announce

    def _init_scaling(self) -> None:
        self.service_defs: dict[str, InferenceService] = {}
        self.load_reports: dict[str, LoadReport] = {}  # the newest sound report per service
        self._scale_dirty: set[str] = set()  # services to tell the scheduler about
        self._scale_sched: Scheduler | None = None  # the scheduler last told everything
        self._services_watch: Any = None

    async def _start_scaling(self) -> None:
        """Watch KV ``services`` (the current definitions first) and subscribe ``load.*``."""
        kv = await self.bus.kv(subjects.KV_SERVICES, InferenceService)
        self._services_watch = await kv.watch(self._on_service)
        await self.bus.subscribe(subjects.LOAD_ALL, LoadReport, self._on_load, with_subject=True)

    async def _on_service(self, key: str, svc: InferenceService | None) -> None:
        """A definition put or deleted; an unsound one counts as none (its replicas stop)."""
        if svc is not None and refused(self.bus, "service", _definition_errors(key, svc), key=key):
            svc = None
        if svc is None:
            self.service_defs.pop(key, None)
        else:
            self.service_defs[key] = svc
        self._scale_dirty.add(key)
        self._kick.set()

    async def _on_load(self, received: tuple[str, LoadReport]) -> None:
        """A load report (and the subject it came on): kept when it is the newest of its
        service; wakes the cycle. One for another service than its subject's is unsound."""
        subject, report = received
        errors = validate_report(report, subject)
        if errors:
            await self.bus.dead_letter(
                subject,
                msgspec.json.encode(report),
                f"not a sound LoadReport: {describe(errors)}",
                pattern=subjects.LOAD_ALL,
                kind="invalid",
            )
            return
        cur = self.load_reports.get(report.service)
        if cur is None or report.time >= cur.time:
            self.load_reports[report.service] = report
            self._scale_dirty.add(report.service)
            self._kick.set()

    def _tell_scheduler(self, sched: Scheduler) -> None:
        """Bring the scheduler's services and reports up to date (all of them for a scheduler
        not told before; a replica of a service no longer defined is stopped by its step)."""
        if sched is not self._scale_sched:
            self._scale_sched = sched
            dirty = set(self.service_defs) | set(self.load_reports) | set(sched.scaler.replicas)
        else:
            dirty = self._scale_dirty
        self._scale_dirty = set()
        for sid in sorted(dirty):
            svc = self.service_defs.get(sid)
            if svc is not None:
                sched.define_service(svc)
            elif sid in sched.scaler.services or sched.scaler.replicas.get(sid):
                sched.remove_service(sid)
            report = self.load_reports.get(sid)
            if report is not None:
                sched.service_load(report)

    async def _scale(self, sched: Scheduler, now: float) -> list[str] | None:
        """The scaler's orders at ``now``, applied (the caller syncs the feed again, queueing
        the added replicas in the order returned, and ticks). None when there was none."""
        self._tell_scheduler(sched)
        orders = sched.scale_step(now)
        added: list[str] = []
        for order in orders:
            for spec in order.add:
                if await self._add_replica(sched, order, spec, now):
                    added.append(spec.id)
            for rid in order.stop:
                await self._stop_replica(order, rid, now)
        if not orders:
            return None
        self._pass_due = True  # an arrival or a departure: the pass must look
        return added

    async def _add_replica(
        self, sched: Scheduler, order: ScaleOrder, spec: JobSpec, now: float
    ) -> bool:
        """Publish the replica's ``Submitted`` (its trace starts here) and fold it at once;
        False when the publish failed."""
        rid = spec.id
        attrs = {"job": rid, "service": order.service, "reason": order.reason}
        with job_span(self.tracer, "placer.scale_up", "", **attrs) as span:
            ev = Submitted(job_id=rid, time=now, spec=spec, trace=traceparent_of())
            try:
                await self.bus.publish(subjects.lifecycle(rid), ev, msg_id=f"submitted-{rid}")
            except Exception as exc:  # not asked after all: the next step asks anew
                sched.scaler.gone(rid)
                self._kick.set()
                self.log.warning("scale_up_unpublished", job=rid, error=repr(exc))
                return False
            self.tracker.apply(ev)  # this cycle's pass may place it (its echo is a no-op)
            await self._audit(order, rid, SCALE_UP, now, span_trace_id(span))
        SCALE_ORDERS.labels("up").inc()
        self.log.info("replica_added", job=rid, service=order.service, reason=order.reason)
        return True

    async def _stop_replica(self, order: ScaleOrder, rid: str, now: float) -> None:
        """End a replica through the cancel path (waiting: Cancelled now; running: killed)."""
        if self.tracker.is_terminal(rid) or rid in self.ended_here:
            return
        alloc = self.ledger.get(rid)
        reason = f"{SCALED_DOWN}: {order.reason}"
        attrs = {"job": rid, "service": order.service, "running": alloc is not None}
        with self._job_span("placer.scale_down", rid, attrs) as span:
            await self._cancel(CancelRequest(job_id=rid, reason=reason, time=now), alloc)
            await self._audit(order, rid, SCALE_DOWN, now, span_trace_id(span))
        SCALE_ORDERS.labels("down").inc()
        self.log.info("replica_stopped", job=rid, service=order.service, reason=order.reason)

    async def _audit(
        self, order: ScaleOrder, rid: str, action: str, now: float, trace_id: str | None
    ) -> None:
        """The order's audit record for one replica (``mosaic explain <replica>``; the
        gateway's ``GET /v1/services`` shows the last one's reason)."""
        reason = f"{order.service}: {order.reason}"
        if order.report_time is not None:
            reason += f" (load report at {order.report_time:.3f})"
        d = Decision(
            job_id=rid, time=now, action=action, service=SERVICE, reason=reason, trace_id=trace_id
        )
        await self.bus.publish(subjects.decisions(SERVICE), d, msg_id=f"decision-{action}-{rid}")
