"""Nodes and their telemetry."""

from __future__ import annotations

import msgspec

from proto.power import PowerState


class NodeSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A node's fixed shape. Published to the ``nodes`` KV bucket by the node's telemetry service.

    Power figures are per GPU. ``gpu_model`` is canonical (``proto.gpus.canonical_model``) but need
    not be in the catalog.
    """

    id: str
    gpu_model: str
    gpu_count: int
    gpu_mem_gb: float
    host_mem_gb: float
    cpus: int
    idle_power_w: float
    max_power_w: float
    labels: dict[str, str] = {}


class GpuSample(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    util: float  # 0..1
    mem_used_gb: float
    temp_c: float
    power_w: float


class TelemetrySample(msgspec.Struct, frozen=True, kw_only=True):
    """One reading of every GPU on a node. Plain NATS: the latest sample wins."""

    node: str
    time: float
    backend: str  # "nvml" or "sim"
    gpus: tuple[GpuSample, ...]
    # the node is asleep (issue 13): its GPUs read idle and cold, and a reader must not take the
    # sample, or a later silence, for a failure
    asleep: bool = False


class RunningAttempt(msgspec.Struct, frozen=True, kw_only=True):
    """One job attempt an executor is running now (``pid`` in local mode, else None)."""

    job_id: str
    attempt: int
    pid: int | None = None


class ExecutorReport(msgspec.Struct, frozen=True, kw_only=True):
    """What one node's executor runs, published every ``interval_s`` on ``executor.<node>``.

    Why: the ledger says what the placer *allocated*; only the executor knows what *runs*. The
    placer reconciles the two: an allocation whose attempt the node has not reported for a
    grace period is requeued (its GPUs freed), and a node that stops reporting for several
    intervals is marked down and its jobs requeued. ``boot_id`` changes on every executor
    start, so a restart is visible even when it is faster than one interval. ``time`` is the
    Mosaic clock. ``power`` is the node's power state (``proto.power``), also the executor's.
    """

    node: str
    time: float
    boot_id: str
    interval_s: float
    running: tuple[RunningAttempt, ...] = ()
    power: PowerState = PowerState()  # see proto.power: an older report decodes as awake
