"""Admission: turn a request body into an accepted ``JobSpec`` or the list of reasons it is not.

Why at the gateway: a job that is malformed, impossible by its own fields, or that no node of the
cluster could ever hold must be refused while the producer is still listening, with the field
and the reason - never accepted and left pending forever. Pure: the service passes in the time
and the cluster it currently knows.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence

import msgspec

from proto.gpus import matches
from proto.jobs import JobSpec
from proto.nodes import NodeSpec
from proto.validation import FieldError, JobRejected, decode_job, validate_job

try:  # the policy core's own check, shared with the placer, when it has landed
    from libs.policy.placement import never_fits as _policy_never_fits
except ImportError:  # pragma: no cover - depends on what has landed
    _policy_never_fits = None


def new_job_id() -> str:
    """Short, unique enough for a cluster (32 random bits) and subject-safe."""
    return f"j-{secrets.token_hex(4)}"


def parse(body: bytes, *, now: float) -> JobSpec:
    """Decode the body, assign an id when it has none, stamp ``submit_time`` = ``now``.

    Raises ``JobRejected`` for malformed JSON, a body that is not an object, or a field of the
    wrong type.
    """
    try:
        raw = msgspec.json.decode(body) if body.strip() else None
    except msgspec.DecodeError as exc:
        raise JobRejected([FieldError("body", f"not valid JSON: {exc}")]) from None
    if not isinstance(raw, dict):
        raise JobRejected([FieldError("body", "must be a JSON object (a JobSpec)")])
    if raw.get("id") in (None, ""):
        raw["id"] = new_job_id()
    raw["submit_time"] = now  # the gateway's clock, whatever the producer sent
    return decode_job(msgspec.json.encode(raw))


def admit(spec: JobSpec, *, now: float, nodes: Sequence[NodeSpec]) -> list[FieldError]:
    """Every reason to refuse ``spec``; empty = accept.

    The field checks come first; the "can any node ever hold it" check runs only on a job whose
    fields are sound and only when the cluster is known (an empty cluster may be starting up).
    """
    models = sorted({(n.gpu_model, n.gpu_mem_gb) for n in nodes})
    errs = validate_job(spec, now=now, cluster_models=models)
    if errs or not nodes:
        return errs
    refusal = never_fits(spec, nodes)
    return [refusal] if refusal else []


def never_fits(spec: JobSpec, nodes: Sequence[NodeSpec]) -> FieldError | None:
    """Why no node of ``nodes`` could hold ``spec`` even when empty, or None if one could.

    The policy core decides when it provides the check (the placer refuses with the same
    function); the local check then only names the field the reason is about.
    """
    local = _local_never_fits(spec, nodes)
    if _policy_never_fits is None:
        return local
    found = _policy_never_fits(spec, list(nodes))
    if not found:
        return None
    reason = found if isinstance(found, str) else (local.reason if local else str(found))
    return FieldError(local.field if local else "job", reason)


# --- local fallback until libs.policy.placement.never_fits lands --------------------------------
# TODO(gateway): drop this once libs.policy.placement.never_fits exists everywhere; the placer
# refuses with that function, and the two must agree.


def _min_gpus(spec: JobSpec) -> float:
    """The smallest GPU request the job would accept (an elastic job can shrink)."""
    return min(spec.gpus, spec.elastic.min_gpus) if spec.elastic else spec.gpus


def _node_misfit(spec: JobSpec, node: NodeSpec) -> tuple[str, str] | None:
    """(field, reason) of the first dimension in which an empty ``node`` is too small."""
    if spec.constraints and not any(matches(c, node.gpu_model) for c in spec.constraints):
        return "constraints", f"GPU model {node.gpu_model} not in {'|'.join(spec.constraints)}"
    gpus_needed = max(1, math.ceil(_min_gpus(spec)))
    if gpus_needed > node.gpu_count:
        return "gpus", f"needs {gpus_needed} GPUs, has {node.gpu_count}"
    if spec.gpu_mem_gb > node.gpu_mem_gb:
        return "gpu_mem_gb", f"needs {spec.gpu_mem_gb:g} GB per GPU, has {node.gpu_mem_gb:g} GB"
    if spec.host_mem_gb > node.host_mem_gb:
        return "host_mem_gb", f"needs {spec.host_mem_gb:g} GB host memory, has {node.host_mem_gb:g}"
    if spec.cpus > node.cpus:
        return "cpus", f"needs {spec.cpus:g} CPUs, has {node.cpus}"
    return None


def _local_never_fits(spec: JobSpec, nodes: Sequence[NodeSpec]) -> FieldError | None:
    groups: dict[str, list[str]] = {}  # reason -> node ids
    fields: set[str] = set()
    for node in nodes:
        misfit = _node_misfit(spec, node)
        if misfit is None:
            return None
        fields.add(misfit[0])
        groups.setdefault(f"{node.gpu_model} x{node.gpu_count}: {misfit[1]}", []).append(node.id)
    parts = [f"{len(ids)} node(s) {r}" for r, ids in sorted(groups.items())]
    field = fields.pop() if len(fields) == 1 else "job"
    return FieldError(field, "no node in the cluster can ever hold this job: " + "; ".join(parts))
