"""Observability shared by every service: structured logs, traces, Prometheus metrics."""

from libs.obs.logging import get_logger, setup_logging
from libs.obs.metrics import (
    DEAD_LETTERS,
    HANDLER_ERRORS,
    HANDLER_SECONDS,
    MESSAGES,
    start_metrics_server,
)
from libs.obs.tracing import (
    build_tracer_provider,
    current_trace_id,
    setup_tracing,
    shutdown_tracing,
    span_trace_id,
)

__all__ = [
    "DEAD_LETTERS",
    "HANDLER_ERRORS",
    "HANDLER_SECONDS",
    "MESSAGES",
    "build_tracer_provider",
    "current_trace_id",
    "get_logger",
    "setup_logging",
    "setup_tracing",
    "shutdown_tracing",
    "span_trace_id",
    "start_metrics_server",
]
