"""Job submissions: what a producer asks for."""

from __future__ import annotations

from typing import Literal

import msgspec

WorkloadClass = Literal["cnn", "rnn", "transformer", "recommendation", "inference", "other"]
WORKLOAD_CLASSES: tuple[str, ...] = (
    "cnn",
    "rnn",
    "transformer",
    "recommendation",
    "inference",
    "other",
)
JobKind = Literal["training", "inference"]

HIGH_PRIORITY = 7  # priority >= 7 is the "high" class in every report


class Elastic(msgspec.Struct, frozen=True):
    """An elastic job runs on anything from min_gpus to max_gpus and may be resized/preempted."""

    min_gpus: int
    max_gpus: int


class JobSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One job as submitted. ``gpus`` < 1 asks for a fraction of one GPU (0.5 = half a GPU).

    ``gpu_mem_gb`` is per GPU (for a fractional job: the memory of its share). ``est_runtime_s``
    is the runtime on the reference GPU (``libs.policy.profiles.REFERENCE_MODEL``); the profile
    scales it for the GPU model the job lands on. ``deadline`` is unix seconds on the Mosaic clock.
    """

    id: str
    tenant: str = "default"
    priority: int = 5
    gpus: float = 1.0
    gpu_mem_gb: float = 8.0
    host_mem_gb: float = 16.0
    cpus: float = 4.0
    workload_class: WorkloadClass = "other"
    constraints: tuple[str, ...] = ()
    deadline: float | None = None
    energy_sensitivity: float = 0.0
    elastic: Elastic | None = None
    checkpointable: bool = False
    est_runtime_s: float = 3600.0
    kind: JobKind = "training"
    # the ML framework ("pytorch", "tensorflow", "jax"...; "" = not said): the profiler learns
    # speed and power per (GPU model, workload class, framework), issue 15
    framework: str = ""
    # a latency-class job (an inference replica) says its p99 target and, when measured, its
    # p99 alone: fractional placement never shares its GPU with work that would push it past
    # the target (libs.policy.stages.share; issue 16). Milliseconds; None = no target / unknown.
    latency_p99_ms: float | None = None
    solo_latency_p99_ms: float | None = None
    # the inference service (proto.inference) this job is a replica of; "" = a job of its own.
    # Replicas are added and stopped by the scaler (libs.policy.stages.scale), never by hand.
    service: str = ""
    command: str | None = None
    # local mode, checkpoint-preemption (docs/runtime-contract.md "Job side"): the signal the
    # job's processes get to save and exit, and the wall seconds they have before SIGTERM
    checkpoint_signal: str = "SIGUSR1"
    checkpoint_grace_s: float = 30.0
    submit_time: float | None = None  # stamped by the gateway on the Mosaic clock


class CancelRequest(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    reason: str = "cancelled by user"
    time: float = 0.0


def with_changes(spec: JobSpec, **changes: object) -> JobSpec:
    """``spec`` with ``changes`` (a frozen struct's copy): what the policy uses to derive a
    job as it runs (a gang's part, a shrunk job, a whole-GPU probe) without importing the
    wire library itself (``libs/policy`` imports only proto, numpy and numba)."""
    return msgspec.structs.replace(spec, **changes)
