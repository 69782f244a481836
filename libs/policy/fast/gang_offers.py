"""The gang rows' offers, kept per view and refreshed only where a node changed.

Why: a queued gang waits for whole nodes, so on a busy cluster nearly every pass asks again
whether it fits (``gang_pass.try_gang``) and nearly every answer is no. The answer depends on
each node's offer (``stages.gang.offers`` over the available nodes) and their sum per GPU model
(``stages.gang.can_hold``); between two passes only the nodes whose jobs ended or started
changed (``ClusterView.node_gen``), so recomputing every node's offer three times per gang row
(place, fits-now, ever-fits) was most of a replay's gang time. ``ShapeOffers`` keeps one
shape's offers and per-model sums and refreshes the changed nodes only (``_node_offer``, the
definition's elementwise rule ``stages.gang.node_offers`` for one node; many changed nodes:
the definition itself); tested equal to the definition (``tests/policy/test_gangs.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.filters import available
from libs.policy.stages import gang as G
from libs.policy.stages.filter import shape_key
from proto.jobs import JobSpec

# up to this many changed nodes are refreshed one by one (``_node_offer``); more, and every
# node is recomputed at once by the definition (``stages.gang.offers``)
SCALAR_NODES = 4


@dataclass(eq=False, slots=True)
class ShapeOffers:
    """One gang shape's ``G.offers(spec, view, available(view, cfg))`` at view change ``gen``:
    ``offer`` (int[N]), ``per_model`` (its sum per GPU model, exact integers) and the
    ``node_gen`` of each node when its offer was computed (``snap``)."""

    spec: JobSpec
    gen: int
    snap: np.ndarray
    offer: np.ndarray
    per_model: list[int]

    @classmethod
    def build(cls, spec: JobSpec, view: ClusterView, cfg: PolicyConfig) -> ShapeOffers:
        offer = G.offers(spec, view, available(view, cfg))
        sums = np.bincount(view.model_idx, weights=offer, minlength=len(view.models))
        return cls(
            spec,
            view.gen,
            view.node_gen.copy(),
            offer,
            [int(s) for s in sums.tolist()],
        )

    def refresh(self, view: ClusterView, cfg: PolicyConfig) -> None:
        """Bring the offers up to the view's current state: recompute the nodes whose
        ``node_gen`` moved (a start, an end, a cordon or a temperature there) and move their
        model's sum by the difference."""
        if self.gen == view.gen:
            return
        changed = np.flatnonzero(view.node_gen != self.snap)
        if len(changed) > SCALAR_NODES:  # many changed: the definition over every node
            fresh = ShapeOffers.build(self.spec, view, cfg)
            self.gen, self.snap, self.offer, self.per_model = (
                fresh.gen, fresh.snap, fresh.offer, fresh.per_model,
            )  # fmt: skip
            return
        ok = available(view, cfg)
        may = G.may_use(self.spec, view)
        host, cpu = G.per_gpu(self.spec)
        for i in changed.tolist():
            new = _node_offer(
                int(view.whole_free[i]),
                float(view.host_mem_free_gb[i]),
                float(view.cpus_free[i]),
                bool(ok[i] and may[i]),
                host,
                cpu,
            )
            self.per_model[int(view.model_idx[i])] += new - int(self.offer[i])
            self.offer[i] = new
            self.snap[i] = view.node_gen[i]
        self.gen = view.gen

    def can_hold(self, k: int) -> bool:
        """``G.can_hold(k, offer, view)``: some model's offers add up to ``k`` GPUs."""
        return any(s >= k for s in self.per_model)


def offers_now(spec: JobSpec, view: ClusterView, cfg: PolicyConfig) -> ShapeOffers:
    """``spec``'s shape's offers on ``view`` as it is now (over the available nodes), kept on
    the view's memo (``ViewMemo.gang_offers``: a copy of the view starts without) and
    refreshed where nodes changed since last asked. Read the arrays, never write them."""
    key = (shape_key(spec), cfg.thermal_max_c)
    hit = view.memo.gang_offers.get(key)
    if hit is None:
        hit = view.memo.gang_offers[key] = ShapeOffers.build(spec, view, cfg)
    else:
        hit.refresh(view, cfg)
    return hit


def _node_offer(
    whole_free: int, host_free_gb: float, cpus_free: float, ok: bool, host: float, cpu: float
) -> int:
    """``stages.gang.node_offers`` for one node in plain Python (a numpy call per operation
    cost more than the rule for the one or two nodes a start or an end changes): the whole
    free GPUs, fewer if the free host memory or CPUs cannot feed that many parts' share
    (``host``, ``cpu``: per GPU), 0 where the job may not go."""
    if not ok:
        return 0
    gpus = whole_free
    if host > EPS:
        gpus = min(gpus, math.floor((host_free_gb + EPS) / host))
    if cpu > EPS:
        gpus = min(gpus, math.floor((cpus_free + EPS) / cpu))
    return max(gpus, 0)
