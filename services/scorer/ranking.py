"""Turn the pending set into a ``RankedQueue``: cluster load and tenant usage from the ledger,
order and score terms from ``libs.policy.priority.rank``. Pure: records in, a record out."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence

import numpy as np

from libs.policy.cluster import RESOURCES, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.priority import rank
from libs.policy.profiles import ProfileTable
from libs.policy.types import PendingJob
from proto.decisions import RankedEntry, RankedQueue
from proto.ledger import Allocation
from proto.nodes import NodeSpec


def tenant_usage(allocations: Iterable[Allocation]) -> dict[str, np.ndarray]:
    """What each tenant holds now, in ``RESOURCES`` order (GPUs, GPU memory, host memory, CPUs),
    for dominant-resource fairness."""
    usage: dict[str, np.ndarray] = {}
    for a in allocations:
        tenant = a.spec.tenant if a.spec is not None else "default"
        n = len(a.gpu_indices)
        v = np.array([n * a.gpu_share, n * a.gpu_mem_gb, a.host_mem_gb, a.cpus], dtype=float)
        usage[tenant] = usage.get(tenant, np.zeros(len(RESOURCES))) + v
    return usage


def build_queue(
    pending: Sequence[PendingJob],
    nodes: Sequence[NodeSpec],
    allocations: Sequence[Allocation],
    *,
    now: float,
    cfg: PolicyConfig,
    profiles: ProfileTable,
) -> RankedQueue:
    """Rank ``pending`` against the cluster as the ledger says it is now."""
    node_ids = {n.id for n in nodes}
    # an allocation on a node that left the KV cannot be placed in the view; it still counts
    # towards its tenant's usage
    view = ClusterView.build(nodes)
    for a in allocations:
        if a.node in node_ids:
            # one that does not fit its node (GPU 99, or a GPU held twice) is left out: it
            # cannot be the placer's, and raising here would fail every ranking from now on
            with contextlib.suppress(ValueError):
                view.allocate(a)
    load = view.load()
    result = rank(
        pending,
        now=now,
        load=load,
        tenant_usage=tenant_usage(allocations),
        capacity=view,
        cfg=cfg,
        profiles=profiles.covering(nodes),
    )
    entries = tuple(
        RankedEntry(
            spec=pending[i].spec,
            score=round(float(result.scores[i]), 6),
            terms={k: round(float(v[i]), 6) for k, v in result.terms.items()},
            enqueued_at=pending[i].enqueued_at,
        )
        for i in result.order.tolist()
    )
    return RankedQueue(time=now, load=round(load, 6), regime=result.regime, entries=entries)
