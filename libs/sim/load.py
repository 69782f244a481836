"""Offered load: how much a trace asks of a cluster, and scaling arrivals to a target load.

Why apart from the runner: the load a comparison runs at is a definition of its own (which
capacity the demand is measured against), quoted in ``results.json`` and by the benchmarks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from proto.nodes import NodeSpec

LOAD_BASES = ("fastest", "effective")
LOAD_DEFINITIONS = {
    "fastest": "sum(GPUs x fastest-GPU runtime) / (GPUs x arrival span)",
    "effective": "sum(GPUs x fastest-GPU runtime) / (effective capacity x arrival span)",
}


def effective_capacity(
    req_gpus: np.ndarray, rt: np.ndarray, models: list[str], nodes: Sequence[NodeSpec]
) -> float:
    """The cluster's capacity in fastest-GPU equivalents for this trace's work mix.

    Why: demand is counted at each job's FASTEST runtime, so a T4 (about half a V100 on most
    classes) must count as half a GPU, or a "load 0.75" over-subscribes a mixed cluster. Each
    model's GPU counts at its speed relative to the job's fastest model (fastest runtime / its
    runtime there), averaged over the jobs weighted by their work (GPUs x fastest runtime).
    """
    fastest = rt.min(axis=1)
    w = req_gpus * fastest
    if w.sum() <= 0:
        return float(sum(n.gpu_count for n in nodes))
    rel = (w[:, None] * (fastest[:, None] / rt)).sum(axis=0) / w.sum()  # per model
    pos = {m: i for i, m in enumerate(models)}
    return float(sum(n.gpu_count * rel[pos[n.gpu_model]] for n in nodes))


def scaled_deadline(spec, submit_s: float, scale: float):
    """Deadlines keep their slack after submit when arrivals are compressed."""
    if spec.deadline is None or scale == 1.0:
        return spec
    import msgspec

    return msgspec.structs.replace(spec, deadline=submit_s / scale + (spec.deadline - submit_s))
