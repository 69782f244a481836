"""The scheduler's inference services, as the part of ``core.Scheduler`` that scales them.

Why apart from ``core``: scaling (``stages.scale``, state in ``scaling.Autoscaler``) is its own
idea with its own events (a service defined or removed, a load report) and its own decision
(``scale_step``); ``core.Scheduler`` inherits these and tells the autoscaler which replicas it
queues, starts and ends.

Both drivers call ``scale_step`` at an instant before ``tick``, apply its orders (make each
added replica a job and queue it; cancel or stop each stopped one), then tick: so a burst's
replica can be placed by the same instant's pass, and the simulator and the placer see the
same orders at the same instants. ``scale_next_s`` is the instant a quiet window ends, which
the driver owes the scheduler like its other wake-ups.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from libs.policy.scaling import ScaleOrder
from proto.inference import InferenceService, LoadReport

if TYPE_CHECKING:
    from libs.policy.core import Scheduler


class ScaleMixin:
    """``core.Scheduler``'s inference services (see the module docstring)."""

    def define_service(self: Scheduler, svc: InferenceService) -> None:
        """A service is defined (or redefined): the next ``scale_step`` brings it in range."""
        self.scaler.define(svc)

    def remove_service(self: Scheduler, service_id: str) -> None:
        """A service is removed: the next ``scale_step`` stops its replicas."""
        self.scaler.remove(service_id)

    def service_load(self: Scheduler, report: LoadReport) -> None:
        """A service's load report (the newest of each service counts)."""
        self.scaler.report(report)

    def scale_step(self: Scheduler, now: float) -> list[ScaleOrder]:
        """The replicas to add and to stop at ``now`` (``scaling.Autoscaler.step``)."""
        return self.scaler.step(now)

    def scale_next_s(self: Scheduler) -> float | None:
        """When a service's quiet window ends (a scale-down may then be due), or None."""
        return self.scaler.next_s()
