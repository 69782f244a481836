"""Inference services: a replicated, latency-class job and the load it reports (issue 16).

A service is not one job but a template and a range: Mosaic runs between ``min_replicas`` and
``max_replicas`` copies of ``replica`` (each an ordinary ``kind="inference"`` job, placed,
preempt-protected and traced like any other) and moves the count with the load the service
reports on ``load.<service>`` (``LoadReport``). The rule is ``libs.policy.stages.scale``.

Replica job ids are ``<service>-<ms>-<k>``: the Mosaic-clock millisecond the scaler decided to
add it, in hex, and its place in that decision. Both drivers decide at the same instants, so
they name replicas alike (the sim ≡ live test compares them), and an id is never reused: a
replica that ended is never submitted again under its old name.
"""

from __future__ import annotations

import math

import msgspec

from proto.jobs import JobSpec
from proto.subjects import load as load_subject

# a service id (SERVICE_ID: 1-48 characters) leaves room in the 64-character job id for
# "-<ms hex, 11>-<k, up to 3>"
from proto.validation import SERVICE_ID, FieldError, revalidate_spec

MAX_REPLICAS = 256


class InferenceService(msgspec.Struct, frozen=True, kw_only=True):
    """A service Mosaic scales. ``rps_per_replica`` is what one replica serves within its p99
    target on the reference GPU (``libs.policy.profiles.REFERENCE_MODEL``), measured by the
    operator's load test; the scaler keeps each replica below ``scale_up_at`` of it.

    Hysteresis, so a noisy load does not flap the count: it scales up as soon as utilisation
    passes ``scale_up_at`` or the reported p99 passes the replica's ``latency_p99_ms``; it
    scales down only after utilisation stayed below ``scale_down_at`` for
    ``scale_down_after_s``, and never within ``scale_down_after_s`` of its last scale-up."""

    id: str
    replica: JobSpec  # the template; its ``id`` is ignored, ``kind`` must be "inference"
    rps_per_replica: float
    min_replicas: int = 1
    max_replicas: int = 8
    scale_up_at: float = 0.8
    scale_down_at: float = 0.5
    scale_down_after_s: float = 300.0


class LoadReport(msgspec.Struct, frozen=True, kw_only=True):
    """What a service (or its sidecar) measured over its last window, on ``load.<service>``.
    ``time`` is the Mosaic clock at the window's end; ``p99_ms`` None = not measured."""

    service: str
    time: float
    rps: float
    p99_ms: float | None = None


def replica_id(service: str, decided_at_s: float, k: int) -> str:
    """The job id of the ``k``-th replica added by the decision taken at ``decided_at_s``."""
    return f"{service}-{round(decided_at_s * 1000):x}-{k}"


def replica_spec(svc: InferenceService, job_id: str, submit_time: float) -> JobSpec:
    """One replica of ``svc`` as a job: the template with its id, its service and its time."""
    return msgspec.structs.replace(
        svc.replica, id=job_id, service=svc.id, kind="inference", submit_time=submit_time
    )


def _finite(errs: list[FieldError], name: str, value: object, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        errs.append(FieldError(name, f"must be a finite number, got {value!r}"))
    elif not low <= value <= high:
        errs.append(FieldError(name, f"must be within {low:g}..{high:g}, got {value:g}"))


def validate_service(svc: InferenceService) -> list[FieldError]:
    """Every reason ``svc`` cannot be run, each naming its field. Empty means valid."""
    errs: list[FieldError] = []
    if not SERVICE_ID.fullmatch(svc.id):
        errs.append(FieldError("id", "must be 1-48 letters, digits or '_'"))
    if svc.replica.kind != "inference":
        errs.append(FieldError("replica.kind", "must be 'inference'"))
    if svc.replica.latency_p99_ms is None:
        errs.append(FieldError("replica.latency_p99_ms", "a service needs a p99 target"))
    probe = msgspec.structs.replace(svc.replica, id="probe", service="")
    errs += [FieldError(f"replica.{e.field}", e.reason) for e in revalidate_spec(probe)]
    _finite(errs, "rps_per_replica", svc.rps_per_replica, 1e-6, 1e9)
    for name in ("min_replicas", "max_replicas"):
        value = getattr(svc, name)
        if isinstance(value, bool) or not isinstance(value, int):
            errs.append(FieldError(name, f"must be a whole number, got {value!r}"))
    if not any(e.field.endswith("_replicas") for e in errs) and not (
        0 <= svc.min_replicas <= svc.max_replicas <= MAX_REPLICAS
    ):
        errs.append(
            FieldError(
                "max_replicas",
                f"needs 0 <= min <= max <= {MAX_REPLICAS}, "
                f"got {svc.min_replicas}..{svc.max_replicas}",
            )
        )
    _finite(errs, "scale_up_at", svc.scale_up_at, 0.01, 1.0)
    _finite(errs, "scale_down_at", svc.scale_down_at, 0.0, 1.0)
    if not errs and svc.scale_down_at >= svc.scale_up_at:
        errs.append(FieldError("scale_down_at", "must be below scale_up_at (hysteresis)"))
    _finite(errs, "scale_down_after_s", svc.scale_down_after_s, 0.0, 7 * 86_400.0)
    return errs


def validate_report(report: LoadReport, subject: str | None = None) -> list[FieldError]:
    """A load report the scaler may act on: a known-shaped service id, finite values, and,
    given the ``subject`` it came on, that subject's own service (``load.<service>``): a report
    speaks for the service its subject names, so a sidecar's report cannot move another
    service by naming it in its body (who may publish on which subject is another matter:
    design notes, "Inference services, live")."""
    errs: list[FieldError] = []
    if not SERVICE_ID.fullmatch(report.service):
        errs.append(FieldError("service", "must be 1-48 letters, digits or '_'"))
    elif subject is not None and subject != load_subject(report.service):
        errs.append(FieldError("service", f"names {report.service!r}, reported on {subject!r}"))
    _finite(errs, "time", report.time, 0.0, 1e12)
    _finite(errs, "rps", report.rps, 0.0, 1e12)
    if report.p99_ms is not None:
        _finite(errs, "p99_ms", report.p99_ms, 0.0, 1e9)
    return errs
