"""Spans that follow a job: every service's decision about a job joins the job's one trace.

Why a stored parent and not only message headers: the placer decides about a job in cycles long
after the message that submitted it (and after restarts), the executor ends it minutes or days
after its run command. Headers link one message to its handler; the job's trace context, a W3C
``traceparent`` string kept with the job (``proto.events.Submitted.trace``,
``proto.commands.RunCommand.trace``), links every later decision to the submission.

A stored string comes off the bus, a trust boundary: ``clean_traceparent`` keeps only a valid
one in canonical form (55 characters), so a malformed or oversized value costs nothing and a
span under it is simply the root of a trace of its own, never an error.

A job that waits is seen by every placer cycle; ``WaitSpanLimiter`` keeps its wait spans to one
per job per interval (or when its reason changes) under a global cap per second.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()
TRACEPARENT = "traceparent"
DEFAULT_WAIT_EVERY_S = 60.0  # a job's wait span at most this often (wall s) unless its reason moves
DEFAULT_WAIT_SPANS_PER_S = 20.0  # all jobs together


def traceparent_of(span: Span | None = None) -> str:
    """``span``'s (default: the current span's) context as a ``traceparent``; "" when none."""
    span = span if span is not None else trace.get_current_span()
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return ""
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def _span_context(traceparent: str) -> trace.SpanContext | None:
    if not traceparent or len(traceparent) > 512:  # a W3C header is 55; room for versions
        return None
    ctx = trace.get_current_span(_PROPAGATOR.extract({TRACEPARENT: traceparent}))
    sc = ctx.get_span_context()
    return sc if sc.is_valid else None


def clean_traceparent(traceparent: str) -> str:
    """The canonical ``traceparent`` for a valid one, else "" (malformed, all zeros, too long)."""
    sc = _span_context(traceparent)
    if sc is None:
        return ""
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"


def trace_id_of(traceparent: str) -> str | None:
    """The 32-hex trace id of a valid ``traceparent`` (for ``Decision.trace_id``), else None."""
    sc = _span_context(traceparent)
    return None if sc is None else f"{sc.trace_id:032x}"


def parent_context(traceparent: str) -> otel_context.Context:
    """A context whose remote parent is ``traceparent``; an empty one (a new root) when it is
    not valid. Why a root and not the current span: a placer cycle or a timer is no cause of
    the job's decision, and must not collect the spans of jobs without a trace."""
    sc = _span_context(traceparent)
    if sc is None:
        return otel_context.Context()
    return trace.set_span_in_context(trace.NonRecordingSpan(sc), otel_context.Context())


@contextmanager
def job_span(
    tracer: trace.Tracer,
    name: str,
    trace_parent: str,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    **attrs: Any,
) -> Iterator[Span]:
    """A current span ``name`` whose parent is the job's ``trace_parent`` (a new root when it is
    empty or malformed), with ``attrs`` (None values left out). Messages published inside carry
    it in their headers. An exception is recorded (status ERROR) and re-raised; a cancellation
    (a kill, a shutdown) only marks the span ``cancelled``: it is no error of the job's."""
    attributes = {k: v for k, v in attrs.items() if v is not None}
    with tracer.start_as_current_span(
        name,
        context=parent_context(trace_parent),
        kind=kind,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except asyncio.CancelledError:
            span.set_attribute("cancelled", True)
            raise
        except Exception as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, repr(exc)))
            raise


class WaitSpanLimiter:
    """Which of the jobs waiting in a cycle get a ``wait`` span now.

    A job gets one when its reason changed since its last span, or ``every_s`` after it; all
    jobs together at most ``per_s`` a second (a token bucket holding ``burst``, default one
    second's worth). A job refused by the cap keeps its claim and gets the next free token, so
    a changed reason is delayed, not lost. ``retain`` forgets jobs that no longer wait (bounded
    by the waiting set); ``dropped`` counts the spans the cap held back.
    """

    def __init__(
        self,
        every_s: float = DEFAULT_WAIT_EVERY_S,
        per_s: float = DEFAULT_WAIT_SPANS_PER_S,
        *,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if every_s < 0 or per_s <= 0:
            raise ValueError(f"every_s >= 0 and per_s > 0, got {every_s} and {per_s}")
        self.every_s, self.per_s = every_s, per_s
        self.burst = max(1.0, per_s if burst is None else burst)
        self.clock = clock
        self._tokens = self.burst
        self._refilled = clock()
        self._last: dict[str, tuple[float, str]] = {}  # job -> (when, reason) of its last span
        self.dropped = 0

    @classmethod
    def from_env(cls) -> WaitSpanLimiter:
        """``MOSAIC_WAIT_SPAN_EVERY_S`` and ``MOSAIC_WAIT_SPANS_PER_S``, else the defaults."""
        every = os.environ.get("MOSAIC_WAIT_SPAN_EVERY_S") or DEFAULT_WAIT_EVERY_S
        per = os.environ.get("MOSAIC_WAIT_SPANS_PER_S") or DEFAULT_WAIT_SPANS_PER_S
        return cls(float(every), float(per))

    def allow(self, job: str, reason: str) -> bool:
        """True when ``job``, waiting for ``reason``, should get a wait span now (and note it)."""
        now = self.clock()
        last = self._last.get(job)
        if last is not None and last[1] == reason and now - last[0] < self.every_s:
            return False
        self._tokens = min(self.burst, self._tokens + (now - self._refilled) * self.per_s)
        self._refilled = now
        if self._tokens < 1.0:
            self.dropped += 1
            return False
        self._tokens -= 1.0
        self._last[job] = (now, reason)
        return True

    def retain(self, waiting: Collection[str]) -> None:
        """Forget every job not in ``waiting`` (placed, ended): its next wait is news."""
        for job in [j for j in self._last if j not in waiting]:
            del self._last[job]

    def __len__(self) -> int:
        return len(self._last)
