"""What the gateway's HTTP API returns. The CLI decodes these same Structs."""

from __future__ import annotations

from typing import Literal

import msgspec

from proto.jobs import JobSpec
from proto.nodes import NodeSpec, TelemetrySample
from proto.power import PowerState
from proto.validation import FieldError

JobState = Literal["pending", "placed", "running", "completed", "failed", "cancelled"]
TERMINAL_STATES: tuple[str, ...] = ("completed", "failed", "cancelled")


class JobView(msgspec.Struct, kw_only=True):
    id: str
    tenant: str
    state: JobState
    priority: int
    gpus: float
    spec: JobSpec
    node: str | None = None
    reason: str = ""  # why pending (Resources, Priority, ...) or why it failed
    score: float | None = None
    submit_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    attempts: int = 0


class NodeView(msgspec.Struct, kw_only=True):
    spec: NodeSpec
    gpus_allocated: float  # sum of GPU shares held
    gpu_mem_allocated_gb: float
    host_mem_allocated_gb: float
    jobs: tuple[str, ...] = ()
    cordoned: bool = False
    cordon_reason: str = ""  # why, when cordoned: the operator's reason or the label (issue 13)
    telemetry: TelemetrySample | None = None
    power: PowerState = PowerState()  # from the node's executor reports (awake if none yet)


class SubmitResponse(msgspec.Struct, kw_only=True):
    job: JobView
    duplicate: bool = False


class ErrorResponse(msgspec.Struct, kw_only=True):
    error: str
    errors: tuple[FieldError, ...] = ()
