"""Score, as the pass runs it: the size mix of the queue (``SizeMix``), the per-model speed and
energy tables (``ModelTables``), the green-job rules (``green_tolerance``, ``is_green``) and
memos; the score terms themselves are the definitions of ``libs.policy.stages.score``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from libs.policy import fast as K
from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.profiles import ProfileTable
from proto.jobs import HIGH_PRIORITY, WORKLOAD_CLASSES, JobSpec

CLASS_INDEX = MappingProxyType({c: i for i, c in enumerate(WORKLOAD_CLASSES)})


@dataclass(frozen=True, slots=True)
class SizeMix:
    """Request sizes (GPUs; < 1 = share of one GPU) and their probabilities (sum 1)."""

    sizes: np.ndarray
    probs: np.ndarray

    @classmethod
    def of(cls, pairs: Sequence[tuple[float, float]]) -> SizeMix:
        """The mix of (size, weight) pairs, weights normalised (``default_mix`` keeps the
        config's one per view)."""
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
        hit = view.shape_memo.model_tables
        if hit is not None and hit[0] is profiles:
            return hit[1]
        tables = cls._build(view, profiles)
        view.shape_memo.model_tables = (profiles, tables)
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


def default_mix(view: ClusterView, cfg: PolicyConfig) -> SizeMix:
    """``SizeMix.of(cfg.size_mix)``, the mix a pass falls back on, kept on the view while the
    config's mix is the same object (the queue's mix memo keys on this one's identity)."""
    hit = view.shape_memo.default_mix
    if hit is None or hit[0] is not cfg.size_mix:
        hit = view.shape_memo.default_mix = (cfg.size_mix, SizeMix.of(cfg.size_mix))
    return hit[1]


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
    demand wakes the greenest suspended nodes first (``PolicyConfig.green_min_tolerance``,
    ``green_max_runtime_s``, ``green_min_gpus``: see the last in the config for why a one-GPU
    job is not green)."""
    return (
        green_tolerance(spec) >= cfg.green_min_tolerance
        and spec.est_runtime_s <= cfg.green_max_runtime_s
        and spec.gpus >= cfg.green_min_gpus
    )


def temps_unknown(view: ClusterView) -> bool:
    """No node reports a temperature (the simulator): every node counts cool."""
    hit = view.memo.temps_unknown  # temperature changes move state_gen
    if hit is None or hit[0] != view.state_gen:
        hit = view.memo.temps_unknown = (view.state_gen, bool(np.isnan(view.temp_c).all()))
    return hit[1]
