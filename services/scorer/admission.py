"""Admission scores: each newly pending job's priority as of the moment it was queued.

Pure: records in, records out. The cluster is the one the nodes and ledger KV describe now (its
load picks the regime and its weights, the tenants' holdings their fair share), and the score
is ``libs.policy.priority.score_arrays``, the same arithmetic the placer's scheduler ranks
with. Only the newcomers are scored: ordering the whole queue is the placer's business now
(``libs.policy.core.Scheduler``, at the moment of each pass), so scoring every pending job here
each round would be work whose result nobody reads. The fair-share term still counts every
tenant with a job waiting (``waiting_tenants``), so a newcomer's score does not depend on which
other jobs happened to arrive in the same round.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.daynight import effective_policy
from libs.policy.priority import regime, score_arrays
from libs.policy.profiles import ProfileTable
from libs.policy.queue import QueueArrays
from libs.policy.types import PendingJob
from libs.policy.usage import tenant_usage
from proto.ledger import Allocation
from proto.nodes import NodeSpec


@dataclass(frozen=True, slots=True)
class AdmissionScore:
    """One newcomer's score (rounded to 6 places, as published) and its terms (sprio-style)."""

    job: PendingJob
    score: float
    terms: dict[str, float]


@dataclass(frozen=True, slots=True)
class Admission:
    """One round: the cluster's load and regime (the scorer's gauges) and the newcomers' scores
    in the order they were given."""

    load: float
    regime: str
    scores: list[AdmissionScore]


def cluster_view(nodes: Sequence[NodeSpec], allocations: Iterable[Allocation]) -> ClusterView:
    """The cluster with the ledger's allocations applied. An allocation on a node that left the
    KV, or one that does not fit its node (GPU 99, a GPU held twice), is left out: it cannot be
    the placer's, and raising here would fail every round from then on (the fuzzer found it)."""
    node_ids = {n.id for n in nodes}
    view = ClusterView.build(nodes)
    for a in allocations:
        if a.node in node_ids:
            with contextlib.suppress(ValueError):
                view.allocate(a)
    return view


def admission_scores(
    jobs: Sequence[PendingJob],
    nodes: Sequence[NodeSpec],
    allocations: Sequence[Allocation],
    *,
    now: float,
    cfg: PolicyConfig,
    profiles: ProfileTable,
    waiting_tenants: Collection[str] = (),
) -> Admission:
    """Score ``jobs`` against the cluster as the ledger says it is now. ``waiting_tenants``: the
    tenants of every pending job (the newcomers' are added), for the fair share's tenant count;
    tenants that hold resources count too (``priority.tenant_count``)."""
    cfg, _ = effective_policy(cfg, now)  # the day/night period in force (as the placer's)
    view = cluster_view(nodes, allocations)
    load = view.load()
    usage = tenant_usage(allocations)
    if not jobs:
        return Admission(load=round(load, 6), regime=regime(load, cfg), scores=[])
    tenants = set(usage) | set(waiting_tenants) | {j.spec.tenant for j in jobs}
    scores, terms, reg = score_arrays(
        QueueArrays.from_jobs(jobs),
        now=now,
        load=load,
        tenant_usage=usage,
        capacity=view,
        cfg=cfg,
        profiles=profiles.covering(nodes),
        n_tenants=len(tenants),
    )
    out = [
        AdmissionScore(
            job=job,
            score=round(float(scores[i]), 6),
            terms={k: round(float(v[i]), 6) for k, v in terms.items()},
        )
        for i, job in enumerate(jobs)
    ]
    return Admission(load=round(load, 6), regime=reg, scores=out)
