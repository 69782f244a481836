"""The allocation ledger: what the placer (its only writer) has committed, one KV entry per job."""

from __future__ import annotations

import msgspec

from proto.jobs import JobSpec


class Allocation(msgspec.Struct, frozen=True, kw_only=True):
    """Resources held by one job on one node.

    ``gpu_indices[i]`` holds ``gpu_share`` of that GPU (1.0 for whole GPUs, 0.5 for half).
    ``gpu_mem_gb`` is per GPU.
    """

    job_id: str
    node: str
    gpu_indices: tuple[int, ...]
    gpu_share: float
    gpu_mem_gb: float
    host_mem_gb: float
    cpus: float
    time: float
    attempt: int = 1
    spec: JobSpec | None = None
