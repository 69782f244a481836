"""What the API answers about inference services (``GET /v1/services``; issue 16, live side).

Why apart from ``proto.inference``: that module is the scheduler's contract (the definition, the
load report, the replica naming); this one is the read side the gateway builds from KV
``services``, the ``load.<service>`` reports and the placer's scale decisions, and that the CLI
decodes (``mosaic services``).
"""

from __future__ import annotations

import msgspec

from proto.inference import InferenceService, LoadReport
from proto.views import JobState

# the placer's audit actions for a scale order (proto.decisions.Decision.action): one record per
# replica added or stopped, its ``reason`` "<service>: <the scaler's reason>"
SCALE_UP = "scale_up"
SCALE_DOWN = "scale_down"
SCALE_ACTIONS = frozenset({SCALE_UP, SCALE_DOWN})
SCALED_DOWN = "scaled down"  # the start of a stopped replica's Cancelled reason


class ReplicaView(msgspec.Struct, frozen=True, kw_only=True):
    """One replica of a service, as the gateway's jobs read model has it."""

    id: str
    state: JobState
    node: str | None = None
    start_time: float | None = None


class ServiceView(msgspec.Struct, frozen=True, kw_only=True):
    """A defined service: its definition, its live replicas, its newest load report and the
    scaler's last order (its reason and when; "" and None before the first)."""

    service: InferenceService
    replicas: tuple[ReplicaView, ...] = ()
    load: LoadReport | None = None
    last_reason: str = ""
    last_scaled_at: float | None = None


class ServicesListing(msgspec.Struct, frozen=True, kw_only=True):
    services: tuple[ServiceView, ...] = ()


def service_of_replica(job_id: str) -> str:
    """The service a replica id names (``proto.inference.replica_id``: ``<service>-<ms>-<k>``;
    a service id has no ``-``), "" for an id of another shape."""
    parts = job_id.rsplit("-", 2)
    return parts[0] if len(parts) == 3 and parts[0] and "-" not in parts[0] else ""
