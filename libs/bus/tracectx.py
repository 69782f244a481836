"""W3C trace context in NATS headers, so a span on the consumer side continues the publisher's
trace (a placement decision links back to the submission that caused it)."""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import context as otel_context
from opentelemetry import propagate


def inject_headers(headers: dict[str, str] | None = None) -> dict[str, str]:
    """``headers`` plus ``traceparent``/``tracestate`` of the current span (if any)."""
    carrier: dict[str, str] = dict(headers or {})
    propagate.inject(carrier)
    return carrier


def extract_context(headers: Mapping[str, str] | None) -> otel_context.Context:
    """The remote parent context carried by ``headers`` (empty context when none)."""
    return propagate.extract(dict(headers or {}))
