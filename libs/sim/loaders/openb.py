"""Alibaba GPU trace v2023 ("openb", FGD, ATC'23): heterogeneous nodes and fractional-GPU pods.

The one public trace with both a mixed-model inventory and jobs that ask for a fraction of a GPU
or for specific GPU types, so it comes with its nodes. Two models are undisclosed (G2, G3); they
are kept under their own names, with an assumed memory, to exercise "any GPU model" handling.

QoS classes (issue 16; ``QOS_CLASSES``, ``with_qos``), Kubernetes' classes as Mosaic's:

* ``LS`` (latency-sensitive) -> an inference job with a latency class: ``latency_p99_ms`` =
  ``LS_P99_MS`` (the trace has no target: an assumed one), priority 7-9, never preempted (an
  inference job is protected, ``stages.preempt``), neither checkpointable nor elastic;
* ``Guaranteed`` -> high-priority training (7-8), not checkpointable: it is never moved;
* ``Burstable`` -> checkpointable training, priority 4-6: it may be stopped for a burst;
* ``BE`` (best effort) -> checkpointable training of low priority (0-3), elastic where it asks
  several whole GPUs (down to half of them): it shrinks first for a burst.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np

from libs.sim.loaders._csv import column, read_csv
from libs.sim.loaders.assemble import assemble
from libs.sim.loaders.fill import MAX_GPUS, Filler, reference_runtime_note
from libs.sim.trace import Trace
from proto.gpus import CATALOG
from proto.jobs import Elastic, JobSpec
from proto.nodes import NodeSpec

DIR = Path("alibaba-gpu-v2023-openb")
NODE_FILE = "openb_node_list_gpu_node.csv"
MODEL_CODES: dict[str, str] = {
    "T4": "t4",
    "P100": "p100",
    "V100M16": "v100-16gb",
    "V100M32": "v100-32gb",
    "A10": "a10",
    "G1": "g1",
    "G2": "g2",
    "G3": "g3",
}
# Undisclosed models: (gpu_mem_gb, max_power_w). G2 nodes (8 GPUs, 96 cores, 384 GB) look like
# V100-class servers, G3 nodes (8 GPUs, 128 cores, 768 GB) like A100-class ones.
UNDISCLOSED: dict[str, tuple[float, float]] = {
    "g1": (16.0, 250.0),
    "g2": (32.0, 300.0),
    "g3": (80.0, 400.0),
}
IDLE_SHARE_OF_TDP = 0.15
QOS_PRIORITY: dict[str, tuple[int, int]] = {  # inclusive ranges, drawn uniformly
    "LS": (7, 9),
    "Burstable": (4, 6),
    "Guaranteed": (7, 8),
    "BE": (0, 3),
}
LS_P99_MS = 100.0  # the LS class's p99 target (assumed: the trace carries none)
# qos -> (checkpointable, elastic where several whole GPUs), for the training classes
QOS_CLASSES: dict[str, tuple[bool, bool]] = {
    "Guaranteed": (False, False),
    "Burstable": (True, False),
    "BE": (True, True),
}
TENANTS = [f"tenant-{i}" for i in range(8)]
POD_COLUMNS = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)


def model_of(code: str, path: Path) -> str:
    try:
        return MODEL_CODES[code.strip()]
    except KeyError:
        raise ValueError(
            f"{path}: unknown GPU model code {code!r}; known: {', '.join(MODEL_CODES)}"
        ) from None


def load_nodes(traces_dir: Path) -> tuple[tuple[NodeSpec, ...], dict[str, float]]:
    """GPU nodes of the openb cluster, and the memory assumed for undisclosed models."""
    path = traces_dir / DIR / NODE_FILE
    cols, rows = read_csv(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model"))
    nodes = []
    extra: dict[str, float] = {}
    for r in rows:
        model = model_of(r[cols["model"]], path)
        spec = CATALOG.get(model)
        if spec is not None:
            mem, tdp, idle = spec.mem_gb, spec.tdp_w, spec.idle_w
        else:
            mem, tdp = UNDISCLOSED[model]
            idle = round(IDLE_SHARE_OF_TDP * tdp, 1)
            extra[model] = mem
        nodes.append(
            NodeSpec(
                id=r[cols["sn"]],
                gpu_model=model,
                gpu_count=int(r[cols["gpu"]]),
                gpu_mem_gb=float(mem),
                host_mem_gb=round(int(r[cols["memory_mib"]]) / 1024, 3),
                cpus=int(r[cols["cpu_milli"]]) // 1000,
                idle_power_w=float(idle),
                max_power_w=float(tdp),
                labels={"source": "openb"},
            )
        )
    return tuple(nodes), extra


def load_openb(traces_dir: Path, *, variant: str = "default", seed: int = 0) -> Trace:
    v = variant.strip().lower()
    path = traces_dir / DIR / f"openb_pod_list_{v}.csv"
    if not path.is_file():
        have = sorted(p.stem.removeprefix("openb_pod_list_") for p in (traces_dir / DIR).glob("*"))
        raise FileNotFoundError(f"openb variant {variant!r}: {path} not found; have {have}")
    if v.startswith("multigpu"):
        raise ValueError(
            f"openb variant {v!r} has no creation/deletion times or QoS (5 columns only), so it "
            "cannot be replayed over time; use default, cpuNNN, gpushareNN or gpuspecNN"
        )
    nodes, extra = load_nodes(traces_dir)
    cols, rows = read_csv(path, POD_COLUMNS)
    n_rows = len(rows)
    try:
        num_gpu = np.array(column(rows, cols["num_gpu"]), dtype=float)
        gpu_milli = np.array(column(rows, cols["gpu_milli"]), dtype=float)
        cpu_milli = np.array(column(rows, cols["cpu_milli"]), dtype=float)
        mem_mib = np.array(column(rows, cols["memory_mib"]), dtype=float)
        created = np.array(column(rows, cols["creation_time"]), dtype=float)
        deleted = np.array(column(rows, cols["deletion_time"]), dtype=float)
        sched_raw = column(rows, cols["scheduled_time"])
        scheduled = np.array([s if s else "nan" for s in sched_raw], dtype=float)
    except ValueError as exc:
        raise ValueError(f"{path}: unparsable value: {exc}") from None
    qos = column(rows, cols["qos"])
    unknown_qos = sorted(set(qos) - set(QOS_PRIORITY))
    if unknown_qos:
        raise ValueError(f"{path}: unknown qos {unknown_qos}; known: {', '.join(QOS_PRIORITY)}")

    start = np.where(np.isnan(scheduled), created, scheduled)
    runtime = deleted - start
    cpu_only = num_gpu <= 0
    too_big = num_gpu > MAX_GPUS
    bad_runtime = ~(runtime > 0)
    keep = ~(cpu_only | too_big | bad_runtime)
    idx = np.flatnonzero(keep)
    gpus = np.where(
        (num_gpu == 1) & (gpu_milli > 0) & (gpu_milli < 1000), gpu_milli / 1000.0, num_gpu
    )[idx]

    specs_raw = column(rows, cols["gpu_spec"])
    constraints = [
        tuple(dict.fromkeys(model_of(c, path) for c in specs_raw[i].split("|") if c.strip()))
        for i in idx.tolist()
    ]
    kept_qos = [qos[i] for i in idx.tolist()]
    is_ls = np.array([q == "LS" for q in kept_qos], dtype=bool)

    f = Filler(seed)
    f.note(
        f"openb:{v}: {n_rows} pods; skipped {int(cpu_only.sum())} CPU-only pods, "
        f"{int((too_big & ~cpu_only).sum())} with more than {MAX_GPUS} GPUs, "
        f"{int((bad_runtime & ~cpu_only & ~too_big).sum())} with deletion <= start; "
        f"{len(idx)} kept, {int((gpus < 1).sum())} of them fractional"
    )
    f.note(
        "openb: GPU codes T4->t4, P100->p100, V100M16->v100-16gb, V100M32->v100-32gb, A10->a10; "
        "undisclosed G1/G2/G3 kept as g1/g2/g3 with assumed "
        + ", ".join(f"{m} {mem:g} GB / {tdp:g} W" for m, (mem, tdp) in UNDISCLOSED.items())
        + f", idle {IDLE_SHARE_OF_TDP:.0%} of TDP"
    )
    f.note(
        "openb: gpus = gpu_milli / 1000 for 1-GPU pods asking < 1000 milli, else num_gpu; "
        "gpu_spec '|'-list -> constraints (alternatives, duplicates removed)"
    )
    f.note(
        "openb: submit_s = creation_time (trace seconds); runtime = deletion_time - "
        "scheduled_time, or - creation_time for never-scheduled (Pending) pods; pods still "
        f"running at trace end are cut at their deletion stamp ({int(deleted.max()):d} s)"
    )
    f.note(
        "openb: qos LS -> inference (kind and class), priority 7-9, latency class p99 "
        f"{LS_P99_MS:g} ms (assumed), never preempted; Guaranteed -> training, 7-8, not "
        "checkpointable; Burstable -> training, 4-6, checkpointable; BE -> training, 0-3, "
        "checkpointable, elastic (min half) when it asks several whole GPUs (priorities "
        "uniform, seeded); only training jobs get deadlines"
    )
    f.note("openb: cpus = cpu_milli / 1000, host_mem_gb = memory_mib / 1024 from the pod")
    f.note(f"openb: no tenant in the trace; drawn seeded, Zipf-weighted over {len(TENANTS)}")
    f.note(reference_runtime_note("openb (pod lifetimes)"))

    prng = f.rng("openb_priority")
    lo = np.array([QOS_PRIORITY[q][0] for q in kept_qos])
    hi = np.array([QOS_PRIORITY[q][1] for q in kept_qos])
    priority = lo + np.floor(prng.random(len(idx)) * (hi - lo + 1)).astype(int)
    weights = [1.0 / (k + 1) for k in range(len(TENANTS))]
    names = column(rows, cols["name"])
    trace = assemble(
        name=f"openb:{v}",
        source=f"openb:{v}",
        filler=f,
        ids=[names[i] for i in idx.tolist()],
        submit_s=created[idx],
        gpus=gpus,
        runtime_s=runtime[idx],
        tenants=f.tenants(len(idx), TENANTS, weights).tolist(),
        kind=["inference" if x else "training" for x in is_ls.tolist()],
        priority=priority,
        constraints=constraints,
        cpus=np.round(cpu_milli[idx] / 1000.0, 3),
        host_mem_gb=np.round(mem_mib[idx] / 1024.0, 3),
        extra_models=extra,
        nodes=nodes,
    )
    qos_of = {names[i]: q for i, q in zip(idx.tolist(), kept_qos, strict=True)}
    jobs = tuple(
        msgspec.structs.replace(j, spec=with_qos(j.spec, qos_of[j.spec.id])) for j in trace.jobs
    )
    return msgspec.structs.replace(trace, jobs=jobs)


def with_qos(spec: JobSpec, qos: str) -> JobSpec:
    """``spec`` as its QoS class says (module docstring); the filler's own draws of
    checkpointable and elastic are replaced by the class's."""
    if qos == "LS":
        return msgspec.structs.replace(
            spec, latency_p99_ms=LS_P99_MS, checkpointable=False, elastic=None
        )
    ckpt, elastic = QOS_CLASSES[qos]
    g = int(spec.gpus)
    grows = elastic and spec.gpus >= 2 and g == spec.gpus
    return msgspec.structs.replace(
        spec,
        checkpointable=ckpt,
        elastic=Elastic(min_gpus=max(1, g // 2), max_gpus=g) if grows else None,
    )


FILL_GPU_MEM_GB = 0.0  # not in the trace: FGD's experiment binds GPU share, CPU and memory only
MOVABLE_QOS = frozenset({"BE", "Burstable"})  # may be migrated by the fill's defragmenter
# the experiment has no clock: a short runtime keeps the rules that trade waiting for speed
# (Mosaic's slow-GPU guard, the speed weight that grows with runtime) out of a placement that
# cannot wait
FILL_RUNTIME_S = 60.0


def load_fill_pods(traces_dir: Path, *, variant: str = "default") -> tuple[list, list[str]]:
    """Every pod of an openb pod list as a ``JobSpec`` for FGD's fill experiment, with its QoS.

    Unlike ``load_openb`` (a replay over time), this keeps what FGD's experiment keeps: every
    pod, CPU-only ones included (they take CPUs and memory, which strands GPUs), whatever its
    phase or lifetime. ``gpus`` = gpu_milli / 1000 for a 1-GPU pod asking < 1000 milli (0 for a
    CPU-only pod), else num_gpu; ``cpus`` = cpu_milli / 1000; ``host_mem_gb`` = memory_mib /
    1024; ``constraints`` = the ``gpu_spec`` alternatives; ``gpu_mem_gb`` = 0 (the trace has no
    GPU memory, and FGD's experiment does not bind it); priority from QoS as in ``load_openb``
    (lower bound of its range: no draw); ``checkpointable`` for QoS in ``MOVABLE_QOS``;
    ``est_runtime_s`` = ``FILL_RUNTIME_S``.
    """
    from proto.jobs import JobSpec

    v = variant.strip().lower()
    path = traces_dir / DIR / f"openb_pod_list_{v}.csv"
    if not path.is_file():
        have = sorted(p.stem.removeprefix("openb_pod_list_") for p in (traces_dir / DIR).glob("*"))
        raise FileNotFoundError(f"openb variant {variant!r}: {path} not found; have {have}")
    cols, rows = read_csv(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"))
    spec_col, qos_col = cols.get("gpu_spec"), cols.get("qos")
    specs: list[JobSpec] = []
    qos: list[str] = []
    for r in rows:
        try:
            num, milli = int(r[cols["num_gpu"]]), int(r[cols["gpu_milli"]] or 0)
            cpu_milli, mem_mib = int(r[cols["cpu_milli"]]), int(r[cols["memory_mib"]])
        except ValueError as exc:
            raise ValueError(f"{path}: unparsable value: {exc}") from None
        q = r[qos_col] if qos_col is not None else "BE"
        if q not in QOS_PRIORITY:
            raise ValueError(f"{path}: unknown qos {q!r}; known: {', '.join(QOS_PRIORITY)}")
        raw = r[spec_col] if spec_col is not None else ""
        cons = tuple(dict.fromkeys(model_of(c, path) for c in raw.split("|") if c.strip()))
        gpus = milli / 1000.0 if num == 1 and 0 < milli < 1000 else float(num)
        specs.append(
            JobSpec(
                id=r[cols["name"]],
                priority=QOS_PRIORITY[q][0],
                gpus=gpus,
                gpu_mem_gb=FILL_GPU_MEM_GB,
                host_mem_gb=mem_mib / 1024.0,
                cpus=cpu_milli / 1000.0,
                constraints=cons if gpus > 0 else (),
                checkpointable=q in MOVABLE_QOS,
                kind="inference" if q == "LS" else "training",
                est_runtime_s=FILL_RUNTIME_S,
            )
        )
        qos.append(q)
    return specs, qos
