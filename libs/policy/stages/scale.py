"""Scale: how many replicas an inference service should have now (the definition, issue 16).

The rule, per service (``proto.inference.InferenceService``), from its latest load report:

* **Capacity** is what the serving (running) replicas handle within the p99 target:
  ``serving x rps_per_replica``. Utilisation is the reported requests/s over it.
* **Up, at once**: utilisation above ``scale_up_at``, or the reported p99 above the replica's
  ``latency_p99_ms``, asks for ``ceil(rps / (rps_per_replica x scale_up_at))`` replicas (one
  more than asked when only the p99 says so, and none is still starting). Replicas already
  asked (pending) count, so a burst is answered once, not at every report while it starts.
* **Down, slowly**: utilisation below ``scale_down_at`` for ``scale_down_after_s`` without a
  break, and at least that long after the last scale-up, gives back replicas down to
  ``ceil(rps / (rps_per_replica x middle))``, ``middle`` halfway between the two thresholds:
  dropping only to the up threshold would scale up again at the next small rise.
* Always within ``[min_replicas, max_replicas]``; a report older than ``stale_after_s`` moves
  nothing (a silent service is not an idle one).

Kubernetes' HorizontalPodAutoscaler is the model (a target utilisation, a scale-down
stabilisation window); scaling on the p99 as well as on the rate is Mosaic's, because the
field report's service was latency-bound. Pure: the memory of the hysteresis is a value in,
a value out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from proto.inference import InferenceService, LoadReport

STALE_AFTER_S = 60.0  # a report older than this moves nothing


@dataclass(frozen=True, slots=True)
class ScaleMemory:
    """What the hysteresis remembers of a service: since when it has been quiet (utilisation
    below ``scale_down_at``), and when it last scaled up."""

    low_since: float | None = None
    last_up_at: float | None = None


@dataclass(frozen=True, slots=True)
class ScaleVerdict:
    """How many replicas the service should have, and why (printed in the audit record)."""

    replicas: int
    memory: ScaleMemory
    reason: str


def replicas_for(svc: InferenceService, rps: float, utilisation: float) -> int:
    """Replicas that serve ``rps`` with each at ``utilisation`` of its capacity, in range."""
    need = math.ceil(max(rps, 0.0) / (svc.rps_per_replica * utilisation) - 1e-9)
    return min(max(need, svc.min_replicas), svc.max_replicas)


def utilisation(svc: InferenceService, rps: float, serving: int) -> float:
    """The reported rate over what ``serving`` replicas handle (inf with none serving and
    some load, 0 with no load)."""
    if serving <= 0:
        return math.inf if rps > 0 else 0.0
    return rps / (serving * svc.rps_per_replica)


def scale_verdict(
    svc: InferenceService,
    report: LoadReport | None,
    *,
    serving: int,
    asked: int,
    memory: ScaleMemory,
    now: float,
    stale_after_s: float = STALE_AFTER_S,
) -> ScaleVerdict:
    """The replica count for ``svc`` at ``now`` (see the module docstring). ``serving``:
    replicas running; ``asked``: replicas running or waiting to start."""
    lo, hi = svc.min_replicas, svc.max_replicas
    if asked < lo:
        return ScaleVerdict(lo, memory, f"below its minimum of {lo}")
    if asked > hi:
        return ScaleVerdict(hi, memory, f"above its maximum of {hi}")
    if report is None or now - report.time > stale_after_s:
        return ScaleVerdict(asked, memory, "no recent load report")
    util = utilisation(svc, report.rps, serving)
    target = svc.replica.latency_p99_ms
    slow = report.p99_ms is not None and target is not None and report.p99_ms > target
    said = f"{report.rps:g} req/s on {serving} serving ({util:.2f} of capacity)"
    if util > svc.scale_up_at or slow:
        want = replicas_for(svc, report.rps, svc.scale_up_at)
        if slow and asked == serving:
            want = max(want, min(asked + 1, hi))
        if want > asked:
            why = f"p99 {report.p99_ms:g} ms > {target:g} ms" if slow else said
            return ScaleVerdict(want, ScaleMemory(None, now), f"up: {why}")
        return ScaleVerdict(asked, ScaleMemory(None, memory.last_up_at), f"busy: {said}")
    if util >= svc.scale_down_at or asked <= lo:
        return ScaleVerdict(asked, ScaleMemory(None, memory.last_up_at), f"steady: {said}")
    since = memory.low_since if memory.low_since is not None else report.time
    quiet_s = now - since
    settled = memory.last_up_at is None or now - memory.last_up_at >= svc.scale_down_after_s
    if quiet_s < svc.scale_down_after_s or not settled:
        return ScaleVerdict(asked, ScaleMemory(since, memory.last_up_at), f"quiet: {said}")
    middle = (svc.scale_up_at + svc.scale_down_at) / 2.0
    want = min(replicas_for(svc, report.rps, middle), asked)
    return ScaleVerdict(
        want,
        ScaleMemory(None, memory.last_up_at),
        f"down: {said} for {quiet_s:.0f} s",
    )


def next_verdict_s(svc: InferenceService, memory: ScaleMemory) -> float | None:
    """When the verdict may change without a new report: the end of the quiet window."""
    if memory.low_since is None:
        return None
    at = memory.low_since + svc.scale_down_after_s
    if memory.last_up_at is not None:
        at = max(at, memory.last_up_at + svc.scale_down_after_s)
    return at
