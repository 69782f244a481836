"""The thermal guard's Prometheus metrics (names are the operator's contract: dashboards and
alerts use them)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# Why these buckets: the target is under 15 s with 5 s telemetry, and a window of 3 samples
# is 10-15 s by design (the first over-threshold sample, then two more, 5 s apart).
DETECTION_TO_INTENT = Histogram(
    "mosaic_thermal_detection_to_intent_seconds",
    "Wall seconds from the first over-threshold sample of the window that made a node hot to "
    "the intent published for it (hold, and the migrations of that window).",
    ["intent"],
    buckets=(1.0, 2.5, 5.0, 7.5, 10.0, 12.5, 15.0, 20.0, 30.0, 60.0),
)
INTENTS = Counter(
    "mosaic_thermal_intents_total",
    "Intents the thermal guard published: hold (hold on or renewed), release, migrate.",
    ["intent"],
)
HOT_NODES = Gauge("mosaic_thermal_hot_nodes", "Nodes the thermal guard holds as hot now.")
