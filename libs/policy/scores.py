"""Placement score terms (Kubernetes "Score" + "NormalizeScore"): each a named function giving,
for the feasible nodes, a value in [0, 1] (1 = best). ``placement.place`` weighs them with the
``PolicyConfig`` weights. These functions are the definitions; ``place`` computes the same
terms for all feasible nodes in one compiled loop (``fast.score_nodes``), which
``tests/policy/test_kernels.py`` checks against them.

The packing term is FGD-like (Weng et al., "Beware of Fragmentation", ATC'23): the fragmentation
of a node is the free GPU capacity that a request drawn from the pending size mix could NOT use;
a placement is good when it grows the expected fragmentation least. That one measure gives
best-fit for fractional jobs (two halves share a GPU) and keeps whole nodes free for gangs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from libs.policy import fast as K
from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.profiles import ProfileTable
from proto.jobs import HIGH_PRIORITY, WORKLOAD_CLASSES, JobSpec

CLASS_INDEX = {c: i for i, c in enumerate(WORKLOAD_CLASSES)}


_MIX_MEMO: dict[tuple, SizeMix] = {}  # SizeMix.of per distinct pairs (config mixes are few)


@dataclass(frozen=True, slots=True)
class SizeMix:
    """Request sizes (GPUs; < 1 = share of one GPU) and their probabilities (sum 1)."""

    sizes: np.ndarray
    probs: np.ndarray

    @classmethod
    def of(cls, pairs: Sequence[tuple[float, float]]) -> SizeMix:
        try:  # a tuple of pairs (PolicyConfig.size_mix) is its own key: no copy per pass
            hit = _MIX_MEMO.get(pairs)  # type: ignore[call-overload]
        except TypeError:  # lists
            hit = None
        if hit is None:
            key = tuple(tuple(p) for p in pairs)
            hit = _MIX_MEMO.get(key)
            if hit is None:
                hit = _MIX_MEMO[key] = cls._of(pairs)
        return hit

    @classmethod
    def _of(cls, pairs: Sequence[tuple[float, float]]) -> SizeMix:
        s = np.array([p[0] for p in pairs], dtype=float)
        w = np.array([p[1] for p in pairs], dtype=float)
        if len(s) == 0 or w.sum() <= 0 or (s <= 0).any() or (w < 0).any():
            raise ValueError("size mix needs sizes > 0 and weights >= 0 with a positive sum")
        return cls(s, w / w.sum())

    @classmethod
    def from_requests(cls, gpus: Sequence[float] | np.ndarray, fallback: SizeMix) -> SizeMix:
        """The mix of the pending queue, weighted by count. Fractional sizes are rounded up to
        tenths of a GPU so the mix stays small (fragmentation cost grows with its length)."""
        g = np.asarray(gpus, dtype=float)
        if g.size == 0:
            return fallback
        # codes 1..10 = tenths of a GPU, 10 + k = k whole GPUs (a histogram beats np.unique)
        code = np.where(g < 1.0, np.clip(np.ceil(g * 10.0 - 1e-6), 1, 10), 10 + np.round(g)).astype(
            np.int64
        )
        return cls.from_code_counts(np.bincount(code), fallback)

    @staticmethod
    def size_code(gpus: float) -> int:
        """The histogram code of one request (as ``from_requests`` bins it)."""
        if gpus < 1.0:
            return int(min(10.0, max(1.0, math.ceil(gpus * 10.0 - 1e-6))))
        return 10 + round(gpus)  # half to even, as np.round (a numpy call costs ~20x more)

    @classmethod
    def from_code_counts(cls, counts: np.ndarray, fallback: SizeMix) -> SizeMix:
        """The mix from a histogram of ``size_code`` values (kept incrementally by
        ``PendingQueue``)."""
        sizes, probs = K.size_mix_of_counts(np.asarray(counts))
        if len(sizes) == 0:
            return fallback
        return cls(sizes, probs)


@dataclass(frozen=True, slots=True)
class ModelTables:
    """Per GPU model of a view: speed and energy per unit of work for each workload class."""

    speed: np.ndarray  # [M, C]
    energy_per_work: np.ndarray  # [M, C]

    @classmethod
    def build(cls, view: ClusterView, profiles: ProfileTable) -> ModelTables:
        """Memoised on the view for the same ``profiles`` object (both are fixed per pass)."""
        hit = view.static_cache.get("model_tables")
        if hit is not None and hit[0] is profiles:
            return hit[1]
        tables = cls._build(view, profiles)
        view.static_cache["model_tables"] = (profiles, tables)
        return tables

    @classmethod
    def _build(cls, view: ClusterView, profiles: ProfileTable) -> ModelTables:
        nodes_by_model = {}
        for nd in view.nodes:
            nodes_by_model.setdefault(nd.gpu_model, nd)
        prof = profiles.covering(nodes_by_model.values())
        sp = prof.speed_matrix(view.models, WORKLOAD_CLASSES)
        pw = prof.power_matrix(view.models, WORKLOAD_CLASSES)
        return cls(sp, pw / sp)


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


def green_tolerance(spec: JobSpec) -> float:
    """How far this job trades speed for energy, in [0, 1]: its ``energy_sensitivity`` (high =
    accepts slower, greener GPUs), or 0 for an urgent job: high priority (``HIGH_PRIORITY``) or
    a deadline. Those keep preferring fast GPUs whatever they declared, so protecting critical
    work never depends on a field the submitter may leave at a default."""
    if spec.priority >= HIGH_PRIORITY or spec.deadline is not None:
        return 0.0
    return min(1.0, max(0.0, float(spec.energy_sensitivity)))


def is_green(spec: JobSpec, cfg: PolicyConfig) -> bool:
    """A job the slow-GPU guard lets start on a slow, greener GPU at once and whose blocked
    demand wakes the greenest suspended nodes first (``PolicyConfig.green_min_tolerance``)."""
    return (
        green_tolerance(spec) >= cfg.green_min_tolerance
        and spec.est_runtime_s <= cfg.green_max_runtime_s
    )


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


def temps_unknown(view: ClusterView) -> bool:
    """No node reports a temperature (the simulator): every node counts cool."""
    hit = view.dyn_cache.get("temps_unknown")  # temperature changes move state_gen
    if hit is None or hit[0] != view.state_gen:
        hit = view.dyn_cache["temps_unknown"] = (view.state_gen, bool(np.isnan(view.temp_c).all()))
    return hit[1]


def s_thermal(view: ClusterView, nodes: np.ndarray, cfg: PolicyConfig) -> np.ndarray:
    """Thermal headroom from ambient to the limit, 1 = cool; unknown temperature counts cool."""
    if temps_unknown(view):
        return np.ones(len(nodes))
    t = view.temp_c[nodes]
    span = max(cfg.thermal_max_c - cfg.thermal_ambient_c, 1e-6)
    h = np.clip((cfg.thermal_max_c - t) / span, 0.0, 1.0)
    return np.where(np.isnan(t), 1.0, h)


def s_memory_fit(view: ClusterView, nodes: np.ndarray, gpu_mem_gb: float) -> np.ndarray:
    """Share of the GPU's memory the job uses: keeps large-memory GPUs for jobs that need them."""
    return np.clip(gpu_mem_gb / np.maximum(view.gpu_mem_gb[nodes], EPS), 0.0, 1.0)
