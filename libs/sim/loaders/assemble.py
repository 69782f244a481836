"""Column arrays from a loader in, a sorted ``Trace`` out, with every missing field filled.

Why: each loader only knows what its file says (times, sizes, maybe a deadline); everything else
is the same seeded fill for every trace, done here once so the loaders stay short.
"""

from __future__ import annotations

import numpy as np

from libs.sim.loaders.fill import Filler, build_specs, clamp_mem_to_constraints
from libs.sim.trace import Trace, TraceJob
from proto.nodes import NodeSpec


def assemble(
    *,
    name: str,
    source: str,
    filler: Filler,
    ids: list[str],
    submit_s: np.ndarray,
    gpus: np.ndarray,
    runtime_s: np.ndarray,
    tenants: list[str],
    workload_class: list[str] | None = None,
    kind: list[str] | None = None,
    priority: np.ndarray | None = None,
    deadline: np.ndarray | None = None,
    constraints: list[tuple[str, ...]] | None = None,
    gpu_mem_gb: np.ndarray | None = None,
    cpus: np.ndarray | None = None,
    host_mem_gb: np.ndarray | None = None,
    runtime_by_model: list[dict[str, float] | None] | None = None,
    extra_models: dict[str, float] | None = None,
    nodes: tuple[NodeSpec, ...] = (),
) -> Trace:
    """Fill what the trace lacks (seeded, noted in ``filler.assumptions``) and sort by submit.

    Passing a column means the trace has it; ``None`` means draw it. A drawn deadline is only
    given to training jobs (inference services run until stopped).
    """
    n = len(ids)
    submit_s = np.asarray(submit_s, dtype=float)
    gpus = np.asarray(gpus, dtype=float)
    runtime_s = np.asarray(runtime_s, dtype=float)
    if kind is None:
        kind = ["training"] * n
    is_inf = np.array([k == "inference" for k in kind], dtype=bool)
    if workload_class is None:
        drawn = filler.training_class(n).tolist()
        pairs = zip(is_inf.tolist(), drawn, strict=True)
        workload_class = ["inference" if inf else c for inf, c in pairs]
    if priority is None:
        priority = filler.priority(n)
    if gpu_mem_gb is None:
        gpu_mem_gb = filler.gpu_mem_gb(gpus, is_inf)
    if constraints is not None:
        gpu_mem_gb = clamp_mem_to_constraints(gpu_mem_gb, constraints, extra_models or {})
        filler.note(
            "gpu_mem_gb of a job with GPU-type constraints is capped at the largest memory "
            "among its allowed models"
        )
    if deadline is None:
        deadline = filler.deadline(submit_s, runtime_s, ~is_inf)
    if cpus is None or host_mem_gb is None:
        c, h = filler.host_resources(gpus)
        cpus = c if cpus is None else cpus
        host_mem_gb = h if host_mem_gb is None else host_mem_gb
    energy = filler.energy_sensitivity(n)
    elastic, ckpt = filler.elastic_checkpointable(gpus, ~is_inf)
    specs = build_specs(
        ids=ids,
        tenants=tenants,
        priority=np.asarray(priority, dtype=int),
        gpus=gpus,
        gpu_mem_gb=np.asarray(gpu_mem_gb, dtype=float),
        host_mem_gb=np.asarray(host_mem_gb, dtype=float),
        cpus=np.asarray(cpus, dtype=float),
        workload_class=workload_class,
        constraints=constraints,
        deadline=np.asarray(deadline, dtype=float),
        energy=energy,
        elastic=elastic,
        checkpointable=ckpt,
        runtime_s=runtime_s,
        kind=kind,
    )
    order = np.argsort(submit_s, kind="stable").tolist()
    subs = submit_s.tolist()
    rbm = runtime_by_model if runtime_by_model is not None else [None] * n
    jobs = tuple(
        TraceJob(spec=specs[i], submit_s=subs[i], runtime_by_model=rbm[i], source=source)
        for i in order
    )
    return Trace(name=name, jobs=jobs, assumptions=tuple(filler.assumptions), nodes=nodes)
