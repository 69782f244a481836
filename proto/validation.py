"""Validation of a job submission, in one place: the gateway, the CLI and the simulator all call it.

A refusal names the field and says what is wrong, so a producer can fix the job without reading
our code.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

import msgspec

from proto.gpus import CATALOG, canonical_model, known_names, matches
from proto.jobs import JobSpec

_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_GPUS_PER_JOB = 64


class FieldError(msgspec.Struct, frozen=True):
    field: str
    reason: str


class JobRejected(ValueError):
    """A submission that cannot be accepted; ``errors`` says which fields and why."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("; ".join(f"{e.field}: {e.reason}" for e in errors))


def decode_job(data: bytes | str) -> JobSpec:
    """Decode JSON into a JobSpec; a type error becomes a JobRejected naming the field."""
    try:
        return msgspec.json.decode(data, type=JobSpec)
    except msgspec.ValidationError as exc:
        text = str(exc)
        m = re.search(r"at `\$\.([A-Za-z_]+)", text)
        raise JobRejected([FieldError(m.group(1) if m else "body", text)]) from None
    except msgspec.DecodeError as exc:
        raise JobRejected([FieldError("body", f"not valid JSON: {exc}")]) from None


def validate_job(
    spec: JobSpec, *, now: float, cluster_models: Iterable[tuple[str, float]] = ()
) -> list[FieldError]:
    """Every reason ``spec`` cannot be accepted. Empty means valid.

    ``cluster_models`` are (gpu_model, gpu_mem_gb) pairs present in the cluster: a model the
    catalog does not list is still a valid constraint when the cluster has it, and its memory
    counts towards the largest GPU memory available.
    """
    cluster = list(cluster_models)
    errs: list[FieldError] = []
    if not _ID.match(spec.id):
        errs.append(FieldError("id", "must be 1-64 characters of letters, digits, '-' or '_'"))
    if not spec.tenant or not _ID.match(spec.tenant):
        errs.append(FieldError("tenant", "must be 1-64 characters of letters, digits, '-' or '_'"))
    if not 0 <= spec.priority <= 9:
        errs.append(FieldError("priority", f"must be 0-9, got {spec.priority}"))
    if not math.isfinite(spec.gpus) or spec.gpus <= 0:
        errs.append(FieldError("gpus", f"must be > 0, got {spec.gpus}"))
    elif spec.gpus > 1 and spec.gpus != int(spec.gpus):
        errs.append(FieldError("gpus", f"above 1 must be a whole number, got {spec.gpus}"))
    elif spec.gpus > MAX_GPUS_PER_JOB:
        errs.append(FieldError("gpus", f"at most {MAX_GPUS_PER_JOB}, got {spec.gpus}"))
    if not math.isfinite(spec.gpu_mem_gb) or spec.gpu_mem_gb <= 0:
        errs.append(FieldError("gpu_mem_gb", f"must be > 0, got {spec.gpu_mem_gb}"))
    else:
        largest = max([s.mem_gb for s in CATALOG.values()] + [m for _, m in cluster])
        if spec.gpu_mem_gb > largest:
            errs.append(
                FieldError(
                    "gpu_mem_gb",
                    f"{spec.gpu_mem_gb:g} GB per GPU is more than any "
                    f"known GPU has (largest {largest:g} GB)",
                )
            )
    if not math.isfinite(spec.host_mem_gb) or spec.host_mem_gb < 0:
        errs.append(FieldError("host_mem_gb", f"must be >= 0, got {spec.host_mem_gb}"))
    if not math.isfinite(spec.cpus) or spec.cpus < 0:
        errs.append(FieldError("cpus", f"must be >= 0, got {spec.cpus}"))
    known = known_names([m for m, _ in cluster])
    unknown = [
        c for c in spec.constraints if c.lower() not in known and canonical_model(c) not in known
    ]
    for c in unknown:
        errs.append(FieldError("constraints", f"unknown GPU model {c!r}"))
    if spec.constraints and not unknown and math.isfinite(spec.gpu_mem_gb):
        # the constraints are alternatives: refuse only when none of them has enough memory
        mems = [
            s.mem_gb for s in CATALOG.values() if any(matches(c, s.model) for c in spec.constraints)
        ]
        mems += [m for model, m in cluster if any(matches(c, model) for c in spec.constraints)]
        if mems and spec.gpu_mem_gb > max(mems):
            errs.append(
                FieldError(
                    "gpu_mem_gb",
                    f"{spec.gpu_mem_gb:g} GB per GPU does not fit on "
                    f"{'|'.join(spec.constraints)} (at most {max(mems):g} GB)",
                )
            )
    if spec.deadline is not None and (not math.isfinite(spec.deadline) or spec.deadline <= now):
        errs.append(FieldError("deadline", "is in the past"))
    if not 0.0 <= spec.energy_sensitivity <= 1.0:
        errs.append(
            FieldError(
                "energy_sensitivity", f"must be between 0 and 1, got {spec.energy_sensitivity}"
            )
        )
    if spec.elastic is not None:
        e = spec.elastic
        if e.min_gpus < 1 or e.max_gpus < e.min_gpus:
            errs.append(
                FieldError("elastic", f"needs 1 <= min <= max, got {e.min_gpus}:{e.max_gpus}")
            )
        elif not e.min_gpus <= spec.gpus <= e.max_gpus:
            errs.append(
                FieldError("elastic", f"gpus {spec.gpus:g} outside {e.min_gpus}:{e.max_gpus}")
            )
    if not math.isfinite(spec.est_runtime_s) or spec.est_runtime_s <= 0:
        errs.append(FieldError("est_runtime_s", f"must be > 0, got {spec.est_runtime_s}"))
    return errs


def check_job(
    spec: JobSpec, *, now: float, cluster_models: Iterable[tuple[str, float]] = ()
) -> None:
    errs = validate_job(spec, now=now, cluster_models=cluster_models)
    if errs:
        raise JobRejected(errs)
