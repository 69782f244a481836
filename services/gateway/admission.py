"""Admission: turn a request body into an accepted ``JobSpec`` or the list of reasons it is not.

Why at the gateway: a job that is malformed, impossible by its own fields, or that no node of the
cluster could ever hold must be refused while the producer is still listening, with the field
and the reason - never accepted and left pending forever. Pure: the service passes in the time
and the cluster it currently knows.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import msgspec

from libs.policy.placement import never_fits as policy_never_fits
from proto.jobs import JobSpec
from proto.nodes import NodeSpec
from proto.validation import FieldError, JobRejected, decode_fields, decode_job, validate_job

# The first word of a ``never_fits`` reason -> the JobSpec field it is about.
_REASON_FIELD = {
    "Constraints": "constraints",
    "GpuCount": "gpus",
    "GpuMemory": "gpu_mem_gb",
    "HostMemory": "host_mem_gb",
    "Cpus": "cpus",
}
_NO_ID = (None, msgspec.Raw(b"null"), msgspec.Raw(b'""'))


def new_job_id() -> str:
    """Short, unique enough for a cluster (32 random bits) and subject-safe."""
    return f"j-{secrets.token_hex(4)}"


def parse(body: bytes, *, now: float) -> JobSpec:
    """Decode the body, assign an id when it has none, stamp ``submit_time`` = ``now``.

    Raises ``JobRejected`` for malformed JSON, a body that is not an object, an unknown field
    (``{"gpu": 4}`` is a typo, not a 1-GPU job) or a field of the wrong type. The top level is
    split without decoding the values (``proto.validation.decode_fields``), so the id and the
    time are set without a generic decode of whatever the producer nested inside.
    """
    if not body.strip():
        raise JobRejected([FieldError("body", "must be a JSON object (a JobSpec), got nothing")])
    fields = decode_fields(body)
    if fields.get("id") in _NO_ID:
        fields["id"] = msgspec.Raw(msgspec.json.encode(new_job_id()))
    fields["submit_time"] = msgspec.Raw(msgspec.json.encode(now))  # the gateway's clock
    return decode_job(msgspec.json.encode(fields))


def admit(spec: JobSpec, *, now: float, nodes: Sequence[NodeSpec]) -> list[FieldError]:
    """Every reason to refuse ``spec``; empty = accept.

    The field checks come first; the "can any node ever hold it" check runs only on a job whose
    fields are sound and only when the cluster is known (an empty cluster may be starting up).
    """
    models = sorted({(n.gpu_model, n.gpu_mem_gb) for n in nodes})
    errs = validate_job(spec, now=now, cluster_models=models)
    if spec.service:  # only the placer's scaler makes replicas (services.placer.scaling)
        why = "replicas are added by the scaler: define the service (POST /v1/services)"
        errs.append(FieldError("service", why))
    if errs or not nodes:
        return errs
    refusal = never_fits(spec, nodes)
    return [refusal] if refusal else []


def never_fits(spec: JobSpec, nodes: Sequence[NodeSpec]) -> FieldError | None:
    """Why no node of ``nodes`` could hold ``spec`` even when empty, or None if one could.

    The policy core decides (the placer refuses with the same function, so the two agree); the
    reason's leading word ("GpuCount: ...") says which field it is about.
    """
    reason = policy_never_fits(spec, list(nodes))
    if not reason:
        return None
    word = reason.split(":", 1)[0].strip()
    return FieldError(
        _REASON_FIELD.get(word, "job"), f"no node in the cluster can ever hold this job: {reason}"
    )
