"""Seeded rules that fill the scheduler fields public traces do not record.

Why one module: every loader needs the same guesses (GPU memory, priority, deadline, ...), and a
benchmark is only comparable across traces if the guesses are the same. Each rule draws from its
own numpy stream, keyed by the seed and the field name, so adding a rule or skipping one never
changes what another field gets; and each rule appends one human-readable line to the trace's
assumptions the first time it is used.

Distributions (chosen to be realistic, documented in each line):
* GPU memory per GPU: about 30 % of training jobs need more than 16 GB (a GPU-counting scheduler
  that puts them on a T4 makes them OOM) and about 8 % more than 32 GB.
* Priority 0-9: about 18 % are high (>= 7).
* Deadlines for about 25 % of training jobs, with slack 1.5-4x the reference runtime.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from libs.sim.trace import REFERENCE_MODEL
from proto.gpus import CATALOG, matches
from proto.jobs import Elastic, JobSpec

# (value, probability) tables; module constants so tests and reports can quote them
TRAINING_MEM_GB: tuple[tuple[float, float], ...] = (
    (4, 0.10),
    (8, 0.22),
    (12, 0.18),
    (16, 0.20),
    (24, 0.10),
    (32, 0.12),
    (40, 0.04),
    (48, 0.02),
    (80, 0.02),
)
INFERENCE_MEM_GB: tuple[tuple[float, float], ...] = ((4, 0.30), (8, 0.40), (16, 0.20), (24, 0.10))
PRIORITY: tuple[tuple[int, float], ...] = (
    (0, 0.05),
    (1, 0.05),
    (2, 0.08),
    (3, 0.12),
    (4, 0.15),
    (5, 0.20),
    (6, 0.17),
    (7, 0.08),
    (8, 0.06),
    (9, 0.04),
)
TRAINING_CLASSES: tuple[tuple[str, float], ...] = (
    ("cnn", 0.35),
    ("transformer", 0.30),
    ("rnn", 0.12),
    ("recommendation", 0.10),
    ("other", 0.13),
)
DEADLINE_SHARE = 0.25
DEADLINE_SLACK = (1.5, 4.0)
CHECKPOINTABLE_SHARE = 0.28
ELASTIC_SHARE_MULTI = 0.30  # of training jobs with >= 2 GPUs
ELASTIC_SHARE_SINGLE = 0.05  # of 1-GPU training jobs (may grow to 2)
FRACTION_MEM_REF_GB = 16.0  # a fractional job's memory = share x this (fits a 16 GB card)
CPUS_PER_GPU = 4.0
HOST_MEM_GB_PER_GPU = 8.0
MAX_GPUS = 64


def _stream(seed: int, field: str) -> np.random.Generator:
    """An independent generator per (seed, field): fields never shift each other's draws."""
    return np.random.default_rng([seed, zlib.crc32(field.encode())])


def _choice(rng: np.random.Generator, table, n: int) -> np.ndarray:
    values = np.array([v for v, _ in table])
    p = np.array([w for _, w in table], dtype=float)
    return rng.choice(values, size=n, p=p / p.sum())


class Filler:
    """Draws missing fields for ``n`` jobs and records each rule it used in ``assumptions``."""

    def __init__(self, seed: int):
        self.seed = seed
        self.assumptions: list[str] = []

    def note(self, text: str) -> None:
        if text not in self.assumptions:
            self.assumptions.append(text)

    def rng(self, field: str) -> np.random.Generator:
        return _stream(self.seed, field)

    # ---- one method per field; each returns a numpy array of length n ----

    def training_class(self, n: int) -> np.ndarray:
        self.note(
            "workload_class (not in trace): drawn seeded from "
            + ", ".join(f"{c} {p:.0%}" for c, p in TRAINING_CLASSES)
        )
        return _choice(self.rng("workload_class"), TRAINING_CLASSES, n)

    def priority(self, n: int) -> np.ndarray:
        self.note(
            "priority (not in trace): drawn seeded 0-9 with weights "
            + " ".join(f"{v}:{p:.0%}" for v, p in PRIORITY)
            + f" (high >= 7: {sum(p for v, p in PRIORITY if v >= 7):.0%})"
        )
        return _choice(self.rng("priority"), PRIORITY, n).astype(int)

    def gpu_mem_gb(self, gpus: np.ndarray, inference: np.ndarray) -> np.ndarray:
        """Per-GPU memory; fractional jobs get their share of a 16 GB card."""
        n = len(gpus)
        train = _choice(self.rng("gpu_mem_gb"), TRAINING_MEM_GB, n).astype(float)
        infer = _choice(self.rng("gpu_mem_gb_inference"), INFERENCE_MEM_GB, n).astype(float)
        over16 = sum(p for v, p in TRAINING_MEM_GB if v > 16)
        over32 = sum(p for v, p in TRAINING_MEM_GB if v > 32)
        self.note(
            "gpu_mem_gb per GPU (not in trace), training: drawn seeded from "
            + " ".join(f"{v:g}GB:{p:.0%}" for v, p in TRAINING_MEM_GB)
            + f" ({over16:.0%} need > 16 GB, {over32:.0%} > 32 GB)"
        )
        mem = train
        if inference.any():
            self.note(
                "gpu_mem_gb per GPU (not in trace), inference: drawn seeded from "
                + " ".join(f"{v:g}GB:{p:.0%}" for v, p in INFERENCE_MEM_GB)
            )
            mem = np.where(inference, infer, train)
        frac = gpus < 1
        if frac.any():
            self.note(
                f"gpu_mem_gb of a fractional job = its GPU share x {FRACTION_MEM_REF_GB:g} GB "
                "(the share must fit on the smallest common 16 GB card)"
            )
            mem = np.where(frac, np.round(gpus * FRACTION_MEM_REF_GB, 3), mem)
        return mem

    def deadline(
        self, submit_s: np.ndarray, runtime_s: np.ndarray, eligible: np.ndarray
    ) -> np.ndarray:
        """Absolute deadline or NaN; only ``eligible`` jobs may get one."""
        n = len(submit_s)
        rng = self.rng("deadline")
        has = rng.random(n) < DEADLINE_SHARE
        slack = rng.uniform(*DEADLINE_SLACK, size=n)
        self.note(
            f"deadline (not in trace): {DEADLINE_SHARE:.0%} of eligible jobs, seeded, at "
            f"submit + U({DEADLINE_SLACK[0]:g}, {DEADLINE_SLACK[1]:g}) x reference runtime"
        )
        return np.where(has & eligible, submit_s + slack * runtime_s, np.nan)

    def energy_sensitivity(self, n: int) -> np.ndarray:
        self.note("energy_sensitivity (not in trace): drawn seeded U(0, 1), 2 decimals")
        return np.round(self.rng("energy_sensitivity").random(n), 2)

    def elastic_checkpointable(
        self, gpus: np.ndarray, training: np.ndarray
    ) -> tuple[list[Elastic | None], np.ndarray]:
        """Elastic ranges for some whole-GPU training jobs; elastic jobs are checkpointable."""
        n = len(gpus)
        rng = self.rng("elastic")
        u = rng.random(n)
        whole = (gpus >= 1) & (gpus == np.floor(gpus)) & training
        multi = whole & (gpus >= 2) & (u < ELASTIC_SHARE_MULTI)
        single = whole & (gpus == 1) & (u < ELASTIC_SHARE_SINGLE)
        ckpt = self.rng("checkpointable").random(n) < CHECKPOINTABLE_SHARE
        self.note(
            f"elastic (not in trace): {ELASTIC_SHARE_MULTI:.0%} of multi-GPU training jobs "
            f"(range gpus//2..gpus) and {ELASTIC_SHARE_SINGLE:.0%} of 1-GPU ones (1..2), seeded"
        )
        self.note(
            f"checkpointable (not in trace): {CHECKPOINTABLE_SHARE:.0%} seeded, plus every "
            "elastic job (resizing needs a checkpoint)"
        )
        elastic: list[Elastic | None] = [None] * n
        for i in np.flatnonzero(multi).tolist():
            g = int(gpus[i])
            elastic[i] = Elastic(min_gpus=max(1, g // 2), max_gpus=g)
        for i in np.flatnonzero(single).tolist():
            elastic[i] = Elastic(min_gpus=1, max_gpus=2)
        return elastic, ckpt | multi | single

    def host_resources(self, gpus: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(cpus, host_mem_gb) proportional to GPUs, matching the leanest seed node (8xT4)."""
        self.note(
            f"cpus / host_mem_gb (not in trace): {CPUS_PER_GPU:g} CPUs and "
            f"{HOST_MEM_GB_PER_GPU:g} GB host RAM per GPU (the 8xT4, 32-CPU, 64 GB seed node "
            "can then hold 8 one-GPU jobs), at least 1 CPU / 2 GB"
        )
        cpus = np.maximum(1.0, np.round(gpus * CPUS_PER_GPU, 2))
        mem = np.maximum(2.0, np.round(gpus * HOST_MEM_GB_PER_GPU, 2))
        return cpus, mem

    def tenants(self, n: int, names: list[str], weights: list[float] | None = None) -> np.ndarray:
        w = np.ones(len(names)) if weights is None else np.asarray(weights, dtype=float)
        return self.rng("tenant").choice(np.array(names), size=n, p=w / w.sum())


def reference_runtime_note(source: str) -> str:
    return (
        f"runtime: {source} does not say which GPU model a job ran on; its duration is taken as "
        f"the runtime on the reference GPU {REFERENCE_MODEL}"
    )


def clamp_mem_to_constraints(
    mem: np.ndarray, constraints: list[tuple[str, ...]], extra_models: dict[str, float]
) -> np.ndarray:
    """Cap each job's per-GPU memory at the largest GPU among its allowed models.

    A job that asks for a T4 cannot have been using 24 GB; the drawn value is lowered so the job
    is valid (``validate_job`` refuses memory no allowed model has).
    """
    out = mem.copy()
    cache: dict[tuple[str, ...], float] = {}
    for i, cons in enumerate(constraints):
        if not cons:
            continue
        if cons not in cache:
            mems = [s.mem_gb for s in CATALOG.values() if any(matches(c, s.model) for c in cons)]
            mems += [m for model, m in extra_models.items() if any(matches(c, model) for c in cons)]
            cache[cons] = max(mems) if mems else math.inf
        out[i] = min(out[i], cache[cons])
    return out


def build_specs(
    *,
    ids: list[str],
    tenants: list[str],
    priority: np.ndarray,
    gpus: np.ndarray,
    gpu_mem_gb: np.ndarray,
    host_mem_gb: np.ndarray,
    cpus: np.ndarray,
    workload_class: list[str],
    constraints: list[tuple[str, ...]] | None,
    deadline: np.ndarray,
    energy: np.ndarray,
    elastic: list[Elastic | None],
    checkpointable: np.ndarray,
    runtime_s: np.ndarray,
    kind: list[str],
) -> list[JobSpec]:
    """Assemble JobSpecs from column arrays (tolist() first: Python scalars, fast loop)."""
    n = len(ids)
    cons = constraints if constraints is not None else [()] * n
    dl = [None if math.isnan(d) else d for d in deadline.tolist()]
    gp = [float(g) if g < 1 else float(int(g)) for g in gpus.tolist()]
    return [
        JobSpec(
            id=i,
            tenant=t,
            priority=p,
            gpus=g,
            gpu_mem_gb=m,
            host_mem_gb=h,
            cpus=c,
            workload_class=w,
            constraints=cs,
            deadline=d,
            energy_sensitivity=e,
            elastic=el,
            checkpointable=ck,
            est_runtime_s=r,
            kind=k,
        )
        for i, t, p, g, m, h, c, w, cs, d, e, el, ck, r, k in zip(
            ids,
            tenants,
            priority.tolist(),
            gp,
            gpu_mem_gb.tolist(),
            host_mem_gb.tolist(),
            cpus.tolist(),
            workload_class,
            cons,
            dl,
            energy.tolist(),
            elastic,
            checkpointable.tolist(),
            runtime_s.tolist(),
            kind,
            strict=True,
        )
    ]
