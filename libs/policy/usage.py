"""What a tenant holds, for dominant-resource fairness: one definition for the scheduler and
the scorer's admission score (the two drivers used to count fractions differently)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from libs.policy.cluster import RESOURCES
from proto.ledger import Allocation, node_allocations


def usage_of(alloc: Allocation) -> np.ndarray:
    """What an allocation holds in ``RESOURCES`` order (GPUs, GPU memory, host memory, CPUs),
    for dominant-resource fairness: its GPU share on each of its GPUs and the GPU memory it
    holds on each (a half-GPU job asking 20 GB holds 0.5 GPUs and 20 GB). One definition for
    the scheduler and the scorer's admission score (the drivers used to count fractions
    differently)."""
    if alloc.parts:  # a gang: what it holds on all its nodes
        return sum((usage_of(a) for a in node_allocations(alloc)), np.zeros(len(RESOURCES)))
    n = len(alloc.gpu_indices)
    return np.array(
        [n * alloc.gpu_share, n * alloc.gpu_mem_gb, alloc.host_mem_gb, alloc.cpus], dtype=float
    )


def tenant_usage(allocations: Iterable[Allocation]) -> dict[str, np.ndarray]:
    """Per tenant, the sum of its allocations' ``usage_of`` (an allocation without its spec
    counts for the tenant "default")."""
    usage: dict[str, np.ndarray] = {}
    for a in allocations:
        tenant = a.spec.tenant if a.spec is not None else "default"
        vec = usage_of(a)
        cur = usage.get(tenant)
        usage[tenant] = vec if cur is None else cur + vec
    return usage
