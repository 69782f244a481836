"""The gateway's Prometheus families, in the process-wide registry beside ``libs.obs.metrics``.

Why these: an operator watching a submission front door wants the refusal rate (bad producers),
the duplicate rate (retrying producers) and request latency per route; everything else (messages,
dead letters) comes from the shared families the bus increments.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

SUBMISSIONS = Counter(
    "mosaic_gateway_submissions_total",
    "Job submissions by outcome: accepted, refused (400), duplicate (same id), unavailable (503).",
    ["outcome"],
)
CANCELS = Counter("mosaic_gateway_cancels_total", "Cancel requests published on jobs.cancel.")
HTTP_SECONDS = Histogram(
    "mosaic_gateway_http_request_seconds",
    "Wall seconds to answer an HTTP request, by route pattern, method and status.",
    ["route", "method", "status"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
JOBS = Gauge("mosaic_gateway_jobs", "Jobs in the gateway's read model, by state.", ["state"])
NODES = Gauge("mosaic_gateway_nodes", "Nodes known to the gateway (KV nodes).")
