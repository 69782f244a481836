"""The allocation ledger: what the placer (its only writer) has committed, one KV entry per job."""

from __future__ import annotations

import msgspec

from proto.jobs import JobSpec


class Part(msgspec.Struct, frozen=True, kw_only=True):
    """One node's share of a gang (a job over several nodes): whole GPUs, and the host memory
    and CPUs of that node it holds (the job's totals split by GPU, ``libs.policy.stages.gang``)."""

    node: str
    gpu_indices: tuple[int, ...]
    host_mem_gb: float
    cpus: float


class Allocation(msgspec.Struct, frozen=True, kw_only=True):
    """Resources held by one job on one node, or by a gang on several.

    ``gpu_indices[i]`` holds ``gpu_share`` of that GPU (1.0 for whole GPUs, 0.5 for half).
    ``gpu_mem_gb`` is per GPU.

    A gang's allocation is still one record (one ledger entry, so its commit is one KV create:
    all parts or none): ``parts`` lists every node's share, the first part's being this
    record's own ``node``/``gpu_indices``/``host_mem_gb``/``cpus`` (its *leader*, whose
    executor reports the job's lifecycle). Empty for a job on one node. Readers that work per
    node expand it with ``node_allocations``.
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
    parts: tuple[Part, ...] = ()


def node_allocations(alloc: Allocation) -> tuple[Allocation, ...]:
    """What ``alloc`` holds per node: itself (one node) or one record per part (each without
    ``parts``), the leader first."""
    if not alloc.parts:
        return (alloc,)
    return tuple(
        msgspec.structs.replace(
            alloc,
            node=p.node,
            gpu_indices=p.gpu_indices,
            host_mem_gb=p.host_mem_gb,
            cpus=p.cpus,
            parts=(),
        )
        for p in alloc.parts
    )


def join_parts(allocs: tuple[Allocation, ...] | list[Allocation]) -> Allocation:
    """The inverse of ``node_allocations``: one record for the per-node ``allocs`` of one job
    (the first is the leader); a single allocation is returned as it is."""
    if len(allocs) == 1:
        return allocs[0]
    parts = tuple(Part(node=a.node, gpu_indices=a.gpu_indices, host_mem_gb=a.host_mem_gb,
                       cpus=a.cpus) for a in allocs)  # fmt: skip
    return msgspec.structs.replace(allocs[0], parts=parts)
