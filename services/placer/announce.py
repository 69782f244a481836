"""What the placer tells others: lifecycle events, node commands and audit decisions.

Why apart from the service: these are the placer's outputs, each with its deterministic
``Nats-Msg-Id`` (so a resend after a crash or a NATS error is deduplicated, never doubled);
the service decides *when* to send, this module *what*. A mixin of ``Placer``: it reads the
placer's bus, clock, tracer, nodes, profiles and tracker.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from contextlib import AbstractContextManager
from functools import cached_property
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span
from prometheus_client import Counter

from libs.bus.connection import Bus
from libs.clock import Clock
from libs.obs.jobspans import WaitSpanLimiter, job_span, trace_id_of, traceparent_of
from libs.obs.tracing import span_trace_id
from libs.policy.core import Scheduler
from libs.policy.profiles import ProfileTable
from proto import subjects
from proto.commands import RunCommand
from proto.decisions import Decision
from proto.events import Cancelled, Failed, Placed, Preempted, Queued
from proto.ledger import Allocation, node_allocations
from proto.nodes import NodeSpec
from services.placer.cycle import Refuse
from services.placer.settings import PlacerSettings
from services.placer.tracker import JobTracker

SERVICE = "placer"
REFUSED = Counter("mosaic_placer_refusals_total", "Jobs failed because no node can hold them.")


class Announcer:
    bus: Bus
    clock: Clock
    log: object
    tracer: trace.Tracer
    nodes: dict[str, NodeSpec]
    profiles: ProfileTable
    tracker: JobTracker
    ended_here: set[str]
    cancelling: set[str]
    waiting: Mapping[str, str]
    settings: PlacerSettings

    @cached_property
    def wait_spans(self) -> WaitSpanLimiter:
        """Which waits get a span (``libs.obs.jobspans``; MOSAIC_WAIT_SPAN*): a test sets it."""
        return WaitSpanLimiter.from_env()

    def _job_span(
        self, name: str, job: str, attrs: dict[str, Any] | None = None
    ) -> AbstractContextManager[Span]:
        """A decision span about ``job`` in the job's trace (a root of its own when none)."""
        return job_span(self.tracer, name, self.tracker.trace_of(job), **(attrs or {"job": job}))

    def _trace_waits(self, news: dict[str, str]) -> None:
        """A ``placer.wait`` span per changed wait, rate-limited by ``wait_spans``: a burst of
        100,000 new waits must not drown the traces or the exporter."""
        limiter = self.wait_spans
        limiter.retain(self.waiting)
        for job, reason in news.items():
            if limiter.allow(job, reason):
                with self._job_span("placer.wait", job, {"job": job, "reason": reason}):
                    pass

    async def _explain_waiting(self, news: dict[str, str], sched: Scheduler) -> None:
        """Each job whose reason to wait changed: a ``Queued`` lifecycle event with the reason
        and its score (what ``mosaic queue`` and the dashboard show) and a ``wait`` Decision
        (what ``mosaic explain`` reads). Only changes, never every cycle: reasons do not flap
        while nothing changes (``core.Scheduler.reason_changes``)."""
        self._trace_waits(news)
        now = self.clock.now()
        scores = sched.queue.cached_scores()
        pos = sched.queue.position

        explained = set(list(news)[: self.settings.explain_waits_per_cycle])

        async def one(job: str, reason: str) -> None:
            queued = sched.queue.get(job)
            attempt = queued.attempt if queued is not None else 1
            raw = float(scores[pos(job)])
            score = round(raw, 6) if math.isfinite(raw) else None  # not scored by a pass yet
            ev = Queued(job_id=job, time=now, reason=reason, score=score)
            tag = f"{job}-{attempt}-{reason}-{int(now)}"
            trace_id = trace_id_of(self.tracker.trace_of(job))
            d = Decision(
                job_id=job,
                time=now,
                action="wait",
                service=SERVICE,
                reason=reason,
                trace_id=trace_id,
                wait=sched.explain(job, now) if job in explained else None,
            )
            await asyncio.gather(
                self.bus.publish(subjects.lifecycle(job), ev, msg_id=f"queued-{tag}"),
                self.bus.publish(subjects.decisions(SERVICE), d, msg_id=f"decision-wait-{tag}"),
            )

        await asyncio.gather(*(one(j, r) for j, r in news.items()))

    async def _refuse(self, r: Refuse) -> None:
        job = r.spec.id
        now = self.clock.now()
        REFUSED.inc()
        with self._job_span("placer.refuse", job, {"job": job, "reason": r.reason}) as span:
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

    async def _requeue(self, alloc: Allocation, reason: str) -> Preempted | Cancelled:
        """Give up an attempt that no longer runs: ``Preempted`` (so the scorer queues the job
        again with the next attempt) and a ``preempt`` decision saying why; a job whose cancel
        was pending on that attempt's kill ends ``Cancelled`` instead."""
        job, now = alloc.job_id, self.clock.now()
        if job in self.cancelling:
            done = Cancelled(job_id=job, time=now, node=alloc.node, reason=reason)
            await self.bus.publish(subjects.lifecycle(job), done, msg_id=f"cancelled-{job}")
            self.ended_here.add(job)
            return done
        ev = Preempted(job_id=job, time=now, node=alloc.node, reason=reason, attempt=alloc.attempt)
        attrs = {"job": job, "node": alloc.node, "reason": reason, "attempt": alloc.attempt}
        with self._job_span("placer.requeue", job, attrs) as span:
            await self.bus.publish(
                subjects.lifecycle(job), ev, msg_id=f"lost-{job}-{alloc.attempt}"
            )
            await self.bus.publish(
                subjects.decisions(SERVICE),
                Decision(
                    job_id=job,
                    time=now,
                    action="preempt",
                    service=SERVICE,
                    node=alloc.node,
                    reason=reason,
                    trace_id=span_trace_id(span),
                ),
                msg_id=f"decision-lost-{job}-{alloc.attempt}",
            )
        return ev

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
        # the placement's span when sent from it, else (a resend) the job's own trace
        trace, here = self.tracker.trace_of(alloc.job_id), traceparent_of()
        if here and (not trace or trace_id_of(here) == trace_id_of(trace)):
            trace = here
        # a gang: each node its own part, all told the gang's nodes (proto.commands.RunCommand)
        parts = node_allocations(alloc)
        gang = tuple(a.node for a in parts) if alloc.parts else ()
        for k, part in enumerate(parts):
            cmd = RunCommand(
                allocation=part, runtime_s=runtime_s, progress=progress, trace=trace, gang=gang
            )
            await self.bus.publish(
                subjects.node_command(part.node, "run"),
                cmd,
                msg_id=f"run-{alloc.job_id}-{alloc.attempt}" + (f"-{part.node}" if k else ""),
            )
