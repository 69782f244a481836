"""Gavel (OSDI'20) job lists with measured per-GPU-type throughputs.

Gavel's traces name a workload and how many training steps it runs; its throughput table says
how many steps per second each workload makes on K80, P100 and V100. So runtime on a GPU type is
``total_steps / throughput`` -- the only traces here whose heterogeneity is measured, not assumed;
``TraceJob.runtime_by_model`` carries it.

Two file layouts are read: the physical-cluster ``.trace`` (10 tab-separated fields) and the
per-VC Philly traces (7 fields, no working directory, priority or SLO).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import numpy as np

from libs.sim.loaders.assemble import assemble
from libs.sim.loaders.fill import Filler
from libs.sim.trace import REFERENCE_MODEL, Trace
from proto.gpus import CATALOG

GPU_TYPES: dict[str, str] = {"k80": "k80", "p100": "p100", "v100": "v100-32gb"}
PHYSICAL_FIELDS = (
    "job_type",
    "command",
    "working_directory",
    "num_steps_arg",
    "needs_data_dir",
    "total_steps",
    "scale_factor",
    "priority_weight",
    "SLO",
    "arrival_time",
)
PER_VC_FIELDS = (
    "job_type",
    "command",
    "num_steps_arg",
    "needs_data_dir",
    "total_steps",
    "arrival_time",
    "scale_factor",
)
CLASS_BY_PREFIX: tuple[tuple[str, str], ...] = (
    ("ResNet", "cnn"),
    ("CycleGAN", "cnn"),
    ("Transformer", "transformer"),
    ("LM", "rnn"),
    ("Recommendation", "recommendation"),
    ("A3C", "other"),
)
HIGH_WEIGHT_PRIORITY = 8
LOW_WEIGHT_PRIORITY = 2
SEARCH_DIRS = (
    Path("gavel") / "physical-cluster-traces",
    Path("philly-derived") / "gavel-per-vc-seed0",
    Path("gavel"),
)


def find_trace_file(arg: str, traces_dir: Path | None) -> Path:
    """``arg`` as a path, else a name under the known Gavel folders (``.trace`` optional)."""
    p = Path(arg)
    if p.is_file():
        return p
    tried = [p]
    if traces_dir is not None and not p.is_absolute():
        for d in SEARCH_DIRS:
            for cand in (traces_dir / d / arg, traces_dir / d / f"{arg}.trace"):
                tried.append(cand)
                if cand.is_file():
                    return cand
    raise FileNotFoundError(
        f"gavel trace {arg!r} not found; tried {', '.join(str(t) for t in tried)}"
    )


def load_throughputs(path: Path) -> dict[str, dict[tuple[str, int], float]]:
    """{gpu type: {(job type, scale factor): isolated steps/s}} from Gavel's JSON."""
    if not path.is_file():
        raise FileNotFoundError(f"gavel throughputs file not found: {path}")
    raw = json.loads(path.read_text(encoding="utf-8"))
    out: dict[str, dict[tuple[str, int], float]] = {}
    for gpu, table in raw.items():
        if gpu not in GPU_TYPES:
            continue  # *_unconsolidated: multi-server placements, not a GPU model
        out[gpu] = {}
        for key, entry in table.items():
            try:
                job_type, sf = ast.literal_eval(key)
            except (ValueError, SyntaxError):
                raise ValueError(f"{path}: unreadable key {key!r} under {gpu!r}") from None
            tput = entry.get("null") if isinstance(entry, dict) else None
            if tput:
                out[gpu][(job_type, int(sf))] = float(tput)
    if "v100" not in out:
        raise ValueError(f"{path}: no v100 throughputs (needed for the reference runtime)")
    return out


def workload_class(job_type: str) -> str:
    for prefix, cls in CLASS_BY_PREFIX:
        if job_type.startswith(prefix):
            return cls
    return "other"


def _read_rows(path: Path) -> tuple[tuple[str, ...], list[list[str]]]:
    lines = [ln.rstrip("\r\n") for ln in path.read_text(encoding="utf-8").splitlines()]
    rows = [ln.split("\t") for ln in lines if ln.strip()]
    if not rows:
        raise ValueError(f"{path}: empty gavel trace")
    widths = {len(r) for r in rows}
    if widths == {len(PHYSICAL_FIELDS)}:
        return PHYSICAL_FIELDS, rows
    if widths == {len(PER_VC_FIELDS)}:
        return PER_VC_FIELDS, rows
    raise ValueError(
        f"{path}: rows have {sorted(widths)} tab-separated fields; expected "
        f"{len(PHYSICAL_FIELDS)} (physical-cluster layout) or {len(PER_VC_FIELDS)} (per-VC layout)"
    )


def load_gavel(
    arg: str, *, traces_dir: Path | None, seed: int = 0, throughputs: Path | None = None
) -> Trace:
    from libs.sim.loaders import DEFAULT_TRACES_DIR

    base = Path(traces_dir) if traces_dir is not None else DEFAULT_TRACES_DIR
    path = find_trace_file(arg, base if base.is_dir() else None)
    tput_path = throughputs or base / "gavel" / "simulation_throughputs.json"
    tputs = load_throughputs(tput_path)
    fields, rows = _read_rows(path)
    col = {name: i for i, name in enumerate(fields)}
    stem = re.sub(r"[^A-Za-z0-9_-]", "_", path.stem)[:40]

    keep: list[int] = []
    runtimes: list[dict[str, float]] = []
    missing = 0
    for k, r in enumerate(rows):
        try:
            steps = float(r[col["total_steps"]])
            sf = int(float(r[col["scale_factor"]]))
            float(r[col["arrival_time"]])
        except ValueError:
            raise ValueError(f"{path}: line {k + 1}: unparsable number in {r}") from None
        if steps <= 0 or sf < 1:
            raise ValueError(f"{path}: line {k + 1}: total_steps and scale_factor must be > 0")
        by_model = {
            GPU_TYPES[g]: steps / table[(r[col["job_type"]], sf)]
            for g, table in tputs.items()
            if (r[col["job_type"]], sf) in table
        }
        if REFERENCE_MODEL not in by_model:
            missing += 1
            continue
        keep.append(k)
        runtimes.append(by_model)
    if not keep:
        raise ValueError(f"{path}: no job has a v100 throughput in {tput_path}")

    f = Filler(seed)
    layout = "physical" if fields == PHYSICAL_FIELDS else "per-VC"
    f.note(
        f"gavel:{path.name}: {len(rows)} jobs ({layout} layout); dropped {missing} whose "
        "(job type, scale factor) has no v100 throughput; "
        f"{len(keep)} kept"
    )
    f.note(
        f"gavel: runtime on a GPU type = total_steps / isolated throughput ('null' entry of "
        f"{tput_path.name}); k80->k80, p100->p100, v100->{REFERENCE_MODEL}; unconsolidated "
        "placements ignored; a type with no (or zero) throughput is left out of runtime_by_model"
    )
    f.note("gavel: submit_s = arrival_time (s); gpus = scale_factor")
    f.note(
        "gavel: class from job type: ResNet/CycleGAN->cnn, Transformer->transformer, LM->rnn, "
        "Recommendation->recommendation, A3C->other"
    )
    f.note(
        "gavel: gpu_mem_gb drawn, then capped at the smallest memory among the GPU types the "
        "job was measured on (it ran there)"
    )
    has_slo = "SLO" in col
    if has_slo:
        f.note(
            "gavel: SLO > 0 -> deadline = arrival + SLO x v100 runtime (Gavel's own rule); "
            f"SLO <= 0 -> none; priority_weight 1 -> drawn, > 1 -> {HIGH_WEIGHT_PRIORITY}, "
            f"< 1 -> {LOW_WEIGHT_PRIORITY}"
        )
    else:
        f.note("gavel: per-VC layout has no SLO or weight: deadlines and priority drawn")
    f.note("gavel: one tenant per trace file (gavel-<file>)")

    sel = [rows[k] for k in keep]
    n = len(sel)
    submit = np.array([float(r[col["arrival_time"]]) for r in sel])
    gpus = np.array([float(int(float(r[col["scale_factor"]]))) for r in sel])
    ref = np.array([rt[REFERENCE_MODEL] for rt in runtimes])
    priority = f.priority(n)
    deadline = None
    if has_slo:
        weight = np.array([float(r[col["priority_weight"]]) for r in sel])
        priority = np.where(weight > 1, HIGH_WEIGHT_PRIORITY, priority)
        priority = np.where(weight < 1, LOW_WEIGHT_PRIORITY, priority)
        slo = np.array([float(r[col["SLO"]]) for r in sel])
        if (slo > 0).any():
            deadline = np.where(slo > 0, submit + np.maximum(slo, 0) * ref, np.nan)
        else:  # the file sets no SLO at all (true of every shipped file): use the shared rule
            f.note("gavel: every SLO in this file is -1 (none): deadlines drawn instead")
    kinds = np.zeros(n, dtype=bool)
    mem = f.gpu_mem_gb(gpus, kinds)
    cap = np.array([min(CATALOG[m].mem_gb for m in rt) for rt in runtimes])
    mem = np.minimum(mem, cap)
    return assemble(
        name=f"gavel:{path.stem}",
        source=f"gavel:{path.name}",
        filler=f,
        ids=[f"gavel-{stem}-{k}" for k in keep],
        submit_s=submit,
        gpus=gpus,
        runtime_s=ref,
        tenants=[f"gavel-{stem}"] * n,
        workload_class=[workload_class(r[col["job_type"]]) for r in sel],
        priority=priority,
        deadline=deadline,
        gpu_mem_gb=mem,
        runtime_by_model=runtimes,
    )


__all__ = ["find_trace_file", "load_gavel", "load_throughputs", "workload_class"]
