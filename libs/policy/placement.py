"""Where a job goes: filter -> score -> pick (the Kubernetes scheduling cycle, pure and vectorised).

``place`` is the scored placer used by the live placer and the simulator; ``first_fit`` is the
simple baseline (first node in order that fits; with ``check_memory=False`` it counts GPUs only,
like a FIFO / Kubernetes-default scheduler that ignores GPU memory). Neither changes the view:
the caller commits with ``view.allocate(to_allocation(...))``.

GPU slots inside the chosen node: a gang takes the lowest-numbered fully free GPUs; a fractional
job takes the best-fit GPU (the one with the least free share that still fits), so halves pack,
among the GPUs the interference model lets it share (``stages.share``: the others look full to
the compiled loops; none left: it waits, reason ``Interference``).

The nodes a request fits now come from ``filters.fit_now`` (one compiled pass over the nodes,
memoised per request shape until the view changes); the score terms of ``libs.policy.scores``
are computed for all feasible nodes in one compiled loop (``fast.score_nodes``), and totals
within ``SCORE_TIE`` of the best go to the first node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from libs.policy import fast as K
from libs.policy import filters as F
from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.filters import never_fits  # re-exported: part of this module's API
from libs.policy.interference import InterferenceModel
from libs.policy.profiles import ProfileTable
from libs.policy.scores import (
    CLASS_INDEX,
    ModelTables,
    SizeMix,
    default_mix,
    green_tolerance,
    temps_unknown,
)
from libs.policy.stages import heat as H
from libs.policy.stages import pack as PK
from libs.policy.stages import score as S
from libs.policy.stages import share as SH
from libs.policy.stages.frag import Workload
from libs.policy.stages.pick import SCORE_TIE, TERMS, pick, term_weights
from libs.policy.types import Candidate, Placement, Refusal
from proto.jobs import JobSpec
from proto.ledger import Allocation

__all__ = [
    "TERMS",
    "PlaceContext",
    "first_fit",
    "never_fits",
    "place",
    "to_allocation",
]


@dataclass(frozen=True, slots=True)
class PlaceContext:
    """What ``place`` precomputes per view/profile; build once per scheduling pass."""

    tables: ModelTables
    mix: SizeMix
    interference: InterferenceModel = field(default_factory=InterferenceModel.default)

    @classmethod
    def build(
        cls,
        view: ClusterView,
        profiles: ProfileTable,
        cfg: PolicyConfig,
        mix: SizeMix | None = None,
    ) -> PlaceContext:
        return cls(ModelTables.build(view, profiles), mix or default_mix(view, cfg))


def place(
    spec: JobSpec,
    view: ClusterView,
    profiles: ProfileTable,
    cfg: PolicyConfig,
    *,
    explain: bool = False,
    ctx: PlaceContext | None = None,
    mask: np.ndarray | None = None,
) -> Placement | Refusal:
    """Best node for ``spec`` now, or why none. ``mask`` (bool[N]) further restricts nodes
    (the scheduler uses it to keep backfill off a reserved node)."""
    ctx = ctx or PlaceContext.build(view, profiles, cfg)
    fit = F.fit_now(spec, view, cfg)
    nodes = K.feasible_nodes(fit, fit if mask is None else mask)
    if len(nodes) == 0:
        per_node = F.explain_nodes(spec, view, cfg) if explain else {}
        if mask is not None and fit.any():
            # it fits now, only not where ``mask`` allows (a reserved node, a slow GPU)
            return Refusal("Reserved", per_node, False)
        reason, never = F.refusal_reason(spec, view, cfg)
        return Refusal(reason, per_node, never)
    frac = F.is_fractional(spec)
    gpu_free = view.gpu_free
    if frac and cfg.share_interference:  # stages.share: slots it may not share look full
        masked = SH.blocked_free(spec, view, ctx.interference, cfg)
        if masked is not None:
            gpu_free = masked
            ok = (masked[nodes] >= spec.gpus - EPS) & (
                view.gpu_mem_free_gb[nodes] >= spec.gpu_mem_gb - EPS
            )
            if not ok.any():
                per_node = {}
                if explain:
                    per_node = F.explain_nodes(spec, view, cfg)
                    per_node |= SH.explain_nodes(spec, view, nodes, ctx.interference, cfg)
                return Refusal(SH.INTERFERENCE, per_node, False)
            nodes = nodes[ok.any(axis=1)]
    cls_i = CLASS_INDEX.get(spec.workload_class, CLASS_INDEX["other"])
    weights = term_weights(spec, green_tolerance(spec), cfg)
    wsum = sum(weights) or 1.0
    k = F.whole_gpus(spec)
    # the score terms of libs.policy.stages.score for every feasible node and the pick of
    # stages.pick, in one compiled loop
    total, term_rows, slot, best = K.score_nodes(
        nodes,
        gpu_free,
        view.gpu_mem_free_gb,
        view.gpu_mem_gb,
        view.model_idx,
        view.temp_c,
        not temps_unknown(view),
        ctx.tables.speed,
        ctx.tables.energy_per_work,
        cls_i,
        frac,
        k,
        float(spec.gpus),
        float(spec.gpu_mem_gb),
        ctx.mix.sizes,
        ctx.mix.probs,
        np.array(weights),
        wsum,
        cfg.thermal_max_c,
        max(cfg.thermal_max_c - cfg.thermal_ambient_c, 1e-6),
        EPS,
        SCORE_TIE,
    )
    frag_slots = None
    if cfg.w_frag > 0 and cfg.frag_workload:  # FGD's term, with the config's target workload
        s_frag, frag_slots = S.s_frag(spec, view, nodes, Workload.of(cfg.frag_workload))
        total = (total * wsum + cfg.w_frag * s_frag) / (wsum + cfg.w_frag)
        best = pick(total)
    risky = view.heat_risky.any() and H.heat_averse(spec, cfg)
    if risky:  # stages.heat: no stuck job there
        total = H.avoid_risky(total, view.heat_risky[nodes])
        best = pick(total)
    if PK.applies(spec):  # stages.pack: a service replica goes fast enough, packed
        best = PK.replica_pick(
            PK.fast_enough(spec, ctx.tables.speed[view.model_idx[nodes], cls_i]),
            view.heat_risky[nodes] if risky else np.zeros(len(nodes), dtype=bool),
            PK.joinable(spec, gpu_free[nodes], view.gpu_mem_free_gb[nodes]),
            view.whole_free[nodes],
            total,
        )
    n = int(nodes[best])
    if frag_slots is not None and frac and gpu_free[n, frag_slots[best][0]] > 0:
        gpu_idx: tuple[int, ...] = frag_slots[best]
        share = float(spec.gpus)
    elif frac:
        gpu_idx = (int(slot[best]),)
        share = float(spec.gpus)
    else:  # the lowest-numbered fully free GPUs (a few slots: plain Python)
        one = 1.0 - EPS
        gpu_idx = tuple([j for j, v in enumerate(view.gpu_free[n].tolist()) if v >= one][:k])
        share = 1.0
    cands: tuple[Candidate, ...] = ()
    if explain:
        ranked = np.argsort(-total, kind="stable").tolist()  # the chosen node first
        top = [best, *(i for i in ranked if i != best)][: cfg.explain_top_k]
        cands = tuple(
            Candidate(
                view.node_ids[int(nodes[i])],
                float(total[i]),
                {t: float(term_rows[j, i]) for j, t in enumerate(TERMS)},
            )
            for i in top
        )
    return Placement(
        node_index=n,
        node_id=view.node_ids[n],
        gpu_indices=gpu_idx,
        gpu_share=share,
        score=float(total[best]),
        terms=dict(zip(TERMS, term_rows[:, best].tolist(), strict=True))
        | ({} if frag_slots is None else {"frag": float(s_frag[best])}),
        candidates=cands,
    )


def first_fit(
    spec: JobSpec, view: ClusterView, *, check_memory: bool = True
) -> Placement | Refusal:
    """The baseline: first node (in view order) where the job fits; first-fit GPU slots.

    ``check_memory=False`` counts GPUs only (no GPU memory, host memory or CPU checks), so it
    may put a 40 GB job on a 16 GB GPU, which then fails with OOM. Constraints and cordons are
    still respected (Kubernetes honours node selectors and taints).
    """
    k = F.whole_gpus(spec)
    ok = F.f_constraints(spec, view) & F.f_cordon(spec, view)
    if F.is_fractional(spec):
        slot_ok = view.gpu_free >= spec.gpus - EPS
        if check_memory:
            slot_ok &= view.gpu_mem_free_gb >= spec.gpu_mem_gb - EPS
        ok &= slot_ok.any(axis=1)
    else:
        ok &= view.whole_free >= k
        if check_memory:
            ok &= F.f_gpu_memory(spec, view)
    if check_memory:
        ok &= F.f_host_memory(spec, view) & F.f_cpus(spec, view)
    nodes = np.flatnonzero(ok)
    if len(nodes) == 0:
        if check_memory:
            reason, never = F.refusal_reason(spec, view, PolicyConfig.default())
        else:
            never = not (F.f_constraints(spec, view) & F.f_gpu_count(spec, view)).any()
            reason = "Constraints" if never else "Resources"
        return Refusal(reason, {}, never)
    n = int(nodes[0])
    row = view.gpu_free[n]
    if F.is_fractional(spec):
        fit = row >= spec.gpus - EPS
        if check_memory:
            fit &= view.gpu_mem_free_gb[n] >= spec.gpu_mem_gb - EPS
        idx: tuple[int, ...] = (int(np.flatnonzero(fit)[0]),)
        share = float(spec.gpus)
    else:
        idx = tuple(int(j) for j in np.flatnonzero(row >= 1.0 - EPS)[:k])
        share = 1.0
    return Placement(n, view.node_ids[n], idx, share, 0.0, {})


def to_allocation(spec: JobSpec, placement: Placement, now: float, attempt: int = 1) -> Allocation:
    """The ledger record for ``spec`` placed at ``placement``."""
    return Allocation(
        job_id=spec.id,
        node=placement.node_id,
        gpu_indices=placement.gpu_indices,
        gpu_share=placement.gpu_share,
        gpu_mem_gb=spec.gpu_mem_gb,
        host_mem_gb=spec.host_mem_gb,
        cpus=spec.cpus,
        time=now,
        attempt=attempt,
        spec=spec,
    )
