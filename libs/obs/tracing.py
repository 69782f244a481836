"""OpenTelemetry tracing set-up: one TracerProvider per process, OTLP/HTTP export when asked.

Why OTLP only when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set: a laptop demo has no collector, and an
exporter pointed at nothing would log connection errors forever. Without it spans are still
created (trace ids flow through NATS headers into decision records); they are just not exported,
and the log says so once.
"""

from __future__ import annotations

import os
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from libs.obs.logging import get_logger

_installed: TracerProvider | None = None


def build_tracer_provider(service: str, endpoint: str | None = None) -> TracerProvider:
    """A TracerProvider with resource ``service.name``; exporting to ``endpoint`` (the OTLP/HTTP
    base URL, e.g. ``http://127.0.0.1:4318``; ``/v1/traces`` is appended) when given."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        url = endpoint.rstrip("/")
        if not url.endswith("/v1/traces"):
            url += "/v1/traces"
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    return provider


def setup_tracing(service: str, endpoint: str | None = None) -> trace.Tracer:
    """Install the process-wide TracerProvider (once) and return a tracer for ``service``.

    ``endpoint`` defaults to ``OTEL_EXPORTER_OTLP_ENDPOINT``. A second call in the same process
    (tests running several services in-process) reuses the first provider: OpenTelemetry allows the
    global provider to be set only once.
    """
    global _installed
    endpoint = endpoint if endpoint is not None else os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    log = get_logger(service=service)
    if _installed is None:
        provider = build_tracer_provider(service, endpoint or None)
        trace.set_tracer_provider(provider)
        _installed = provider
        if endpoint:
            log.info("tracing", exporter="otlp-http", endpoint=endpoint)
        else:
            log.info("tracing", exporter="none", hint="set OTEL_EXPORTER_OTLP_ENDPOINT to export")
    return trace.get_tracer(service)


def shutdown_tracing() -> None:
    """Flush and stop the exporter (called on service exit so the last spans are not lost)."""
    if _installed is not None:
        _installed.force_flush(timeout_millis=5000)
        _installed.shutdown()


def current_trace_id() -> str | None:
    """The current span's trace id as 32 hex digits, or None outside a valid span."""
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


def span_trace_id(span: Any) -> str | None:
    """The trace id of ``span`` as hex, or None."""
    ctx = span.get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None
