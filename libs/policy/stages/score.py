"""Score (Kubernetes "Score" + "NormalizeScore"), the definitions: each placement term a named
function giving, for the feasible nodes, a value in [0, 1] (1 = best). ``placement.place``
weighs them with the ``PolicyConfig`` weights (``w_speed``, ``w_energy``, ``w_pack``,
``w_thermal``, ``w_memory_fit``) and picks the best total (``stages.pick``). The pass computes
the same terms for all feasible nodes in one compiled loop (``fast.score_nodes``), which
``tests/policy/test_kernels.py`` checks against these.

The packing term is FGD-like (Weng et al., "Beware of Fragmentation", ATC'23): the fragmentation
of a node is the free GPU capacity that a request drawn from the pending size mix could NOT use;
a placement is good when it grows the expected fragmentation least. That one measure gives
best-fit for fractional jobs (two halves share a GPU) and keeps whole nodes free for gangs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig

if TYPE_CHECKING:
    from libs.policy.scores import ModelTables, SizeMix
    from libs.policy.stages.frag import Workload
    from proto.jobs import JobSpec


def fragmentation(free: np.ndarray, mix: SizeMix) -> np.ndarray:
    """Expected free GPU share per row that a request drawn from ``mix`` could not use.

    ``free``: float[R, G] free share of each GPU slot. A whole request of k GPUs can use a node's
    fully free GPUs only if there are at least k of them; a fractional request of s can use any
    GPU with at least s free.
    """
    total = free.sum(axis=1)
    full = (free >= 1.0 - EPS).sum(axis=1)
    partial = total - full
    whole = mix.sizes >= 1.0 - EPS
    out = np.zeros(free.shape[0])
    if whole.any():
        k = np.round(mix.sizes[whole])
        unusable = np.where(full[:, None] >= k[None, :], partial[:, None], total[:, None])
        out += unusable @ mix.probs[whole]
    if (~whole).any():
        s = mix.sizes[~whole]
        small = free[:, :, None] < (s[None, None, :] - EPS)
        out += (np.where(small, free[:, :, None], 0.0).sum(axis=1)) @ mix.probs[~whole]
    return out


def normalize_higher_better(x: np.ndarray) -> np.ndarray:
    """Min-max to [0, 1]; all equal -> 1."""
    lo, hi = float(x.min()), float(x.max())
    if hi - lo < 1e-12:
        return np.ones_like(x)
    return (x - lo) / (hi - lo)


def s_speed(view: ClusterView, nodes: np.ndarray, cls_i: int, tables: ModelTables) -> np.ndarray:
    """Relative speed of this workload class on each node's GPU model (fastest = 1)."""
    sp = tables.speed[view.model_idx[nodes], cls_i]
    return sp / sp.max()


def s_energy(view: ClusterView, nodes: np.ndarray, cls_i: int, tables: ModelTables) -> np.ndarray:
    """Energy per unit of work (greenest = 1, others min/own)."""
    e = tables.energy_per_work[view.model_idx[nodes], cls_i]
    return e.min() / e


def s_pack(before: np.ndarray, after: np.ndarray, mix: SizeMix) -> tuple[np.ndarray, np.ndarray]:
    """(score, fragmentation growth): least growth of expected fragmentation scores 1."""
    both = fragmentation(np.concatenate([after, before]), mix)
    growth = both[: len(after)] - both[len(after) :]
    return normalize_higher_better(-growth), growth


def s_thermal(view: ClusterView, nodes: np.ndarray, cfg: PolicyConfig) -> np.ndarray:
    """Thermal headroom from ambient to the limit, 1 = cool; unknown temperature counts cool."""
    if np.isnan(view.temp_c).all():  # (the pass memoises this: ``scores.temps_unknown``)
        return np.ones(len(nodes))
    t = view.temp_c[nodes]
    span = max(cfg.thermal_max_c - cfg.thermal_ambient_c, 1e-6)
    h = np.clip((cfg.thermal_max_c - t) / span, 0.0, 1.0)
    return np.where(np.isnan(t), 1.0, h)


def s_memory_fit(view: ClusterView, nodes: np.ndarray, gpu_mem_gb: float) -> np.ndarray:
    """Share of the GPU's memory the job uses: keeps large-memory GPUs for jobs that need them."""
    return np.clip(gpu_mem_gb / np.maximum(view.gpu_mem_gb[nodes], EPS), 0.0, 1.0)


def s_frag(
    spec: JobSpec, view: ClusterView, nodes: np.ndarray, work: Workload
) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """(score, GPU slots) per feasible node: FGD's term (``stages.frag``, Weng et al., ATC'23).

    A node's growth of expected fragmentation for the target workload ``work`` when the job
    lands there, on the GPU(s) of that node that grow it least; the least growth scores 1.
    Unlike ``s_pack`` (the pending queue's GPU sizes only), the workload carries GPU models,
    CPUs and memory, so a node whose CPUs a job exhausts counts its stranded GPUs. Used when
    the config carries a workload (``PolicyConfig.frag_workload``) and ``w_frag`` > 0.
    """
    from libs.policy.stages.frag import growth

    fit = np.zeros(len(view.node_ids), dtype=bool)
    fit[nodes] = True
    opt_node, opt_slots, g = growth(spec, view, fit, work, work.allowed(view))
    pos = np.searchsorted(nodes, opt_node)  # ``nodes`` is increasing (np.flatnonzero)
    # per node, the first option of the least growth (options run node by node, GPU by GPU)
    order = np.lexsort((np.arange(len(g)), np.round(g, 12), pos))
    first = order[np.flatnonzero(np.r_[True, np.diff(pos[order]) != 0])]
    best = np.full(len(nodes), np.inf)
    best[pos[first]] = g[first]
    slots: list[tuple[int, ...]] = [()] * len(nodes)
    for i, o in zip(pos[first].tolist(), first.tolist(), strict=True):
        slots[i] = tuple(np.flatnonzero(opt_slots[o]).tolist())
    return normalize_higher_better(-best), slots
