"""Prometheus metrics shared by every service, and the ``/metrics`` endpoint.

Why one module: the metric names are part of the operator's contract (dashboards and alerts use
them), so they are defined once here and every service increments the same families with its own
``service`` label. Label ``subject`` is the *subscription* pattern (``lifecycle.>``), never a
concrete subject such as ``lifecycle.<job id>``: one time series per job would swamp Prometheus.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from libs.obs.health import Health, ObsServer

MESSAGES = Counter(
    "mosaic_messages_total",
    "Messages handled by a service, by subscription subject.",
    ["service", "subject"],
)
DEAD_LETTERS = Counter(
    "mosaic_dead_letters_total",
    "Messages that could not be decoded or handled and went to dlq.<service>.",
    ["service", "subject"],
)
DEAD_LETTER_KINDS = Counter(
    "mosaic_dead_letters_by_kind_total",
    "Dead letters by why: too_large, too_deep (decode limits), decode, handler (kept failing).",
    ["service", "kind"],
)
LOOPS_ENDED = Counter(
    "mosaic_receive_loops_ended_total",
    "Receive loops (consumers, subscriptions, KV watches) that ended other than by their owner's "
    "stop(); each also makes /healthz 503.",
    ["service", "loop"],
)
HANDLER_ERRORS = Counter(
    "mosaic_handler_errors_total",
    "Handler calls that raised (the message is retried, then dead-lettered).",
    ["service", "subject"],
)
HANDLER_SECONDS = Histogram(
    "mosaic_handler_seconds",
    "Wall seconds spent in a message handler.",
    ["service", "subject"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
UP = Gauge("mosaic_service_up", "1 while the service is connected and serving.", ["service"])


def start_metrics_server(
    port: int, host: str = "127.0.0.1", health: Health | None = None
) -> int | None:
    """Serve ``/metrics`` (and ``/healthz`` when ``health`` is given) on ``port`` in a
    background thread; port 0 means off (returns None).

    ``host`` defaults to loopback: metrics say what runs where, so exposing them on every
    interface is an operator's explicit choice (``--metrics-host 0.0.0.0`` in a container whose
    network is its own). Returns the port actually served so a caller can log it.
    """
    if port < 0:
        raise ValueError(f"metrics port must be >= 0, got {port}")
    if port == 0:
        return None
    return ObsServer(health, port, host).port
