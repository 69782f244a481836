"""Offered load: how much a trace asks of a cluster, and scaling arrivals to a target load.

Why apart from the runner: the load a comparison runs at is a definition of its own (which
capacity the demand is measured against), quoted in ``results.json`` and by the benchmarks.
"""

from __future__ import annotations

import math
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


def scale_to_load(
    jobs: list,
    rt: np.ndarray,
    models: list[str],
    nodes: Sequence[NodeSpec],
    load: float | None,
    basis: str,
) -> tuple[list, dict]:
    """The trace's jobs with arrivals compressed (or stretched) so the offered demand is
    ``load`` of the ``basis`` capacity (None: as recorded), deadlines keeping their slack;
    and the ``results.json`` record of the load (natural, scale, offered, both bases)."""
    import msgspec

    capacity = float(sum(n.gpu_count for n in nodes))
    submit = np.array([j.submit_s for j in jobs])
    span = float(submit.max() - submit.min())
    req = np.array([j.spec.gpus for j in jobs])
    demand = float((req * rt.min(axis=1)).sum())
    eff_capacity = effective_capacity(req, rt, models, nodes)
    basis_capacity = capacity if basis == "fastest" else eff_capacity
    natural = demand / (basis_capacity * span) if span > 0 else math.inf
    scale = 1.0
    if load is not None and span > 0:
        scale = load / natural
        jobs = [
            msgspec.structs.replace(
                j, spec=scaled_deadline(j.spec, j.submit_s, scale), submit_s=j.submit_s / scale
            )
            for j in jobs
        ]
    record = {
        "natural_demand_over_capacity": natural,
        "arrival_scale": scale,
        "offered_demand_over_capacity": natural * scale,
        "basis": basis,
        "definition": LOAD_DEFINITIONS[basis],
        "effective_capacity_gpus": eff_capacity,
        "offered_demand_over_gpus": demand / (capacity * span) * scale if span > 0 else None,
        "offered_demand_over_effective_capacity": (
            demand / (eff_capacity * span) * scale if span > 0 else None
        ),
    }
    return jobs, record
