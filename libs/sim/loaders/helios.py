"""SenseTime Helios, Venus cluster (SC'21): real arrival counts, synthetic job bodies.

The job log itself is not public here, but the complete per-10-minute series of GPU-job
submissions (and GPUs submitted) is. So arrivals are real: each bin gets exactly its number of
GPU jobs, spread uniformly within the bin, and the bin's GPU total is split among them. Runtimes
are drawn from a lognormal matched to Venus's published median and mean GPU-job runtime.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from libs.sim.loaders._csv import column, read_csv
from libs.sim.loaders.assemble import assemble
from libs.sim.loaders.fill import MAX_GPUS, Filler, reference_runtime_note
from libs.sim.trace import Trace

DIR = Path("helios")
SERIES = "venus_cluster_throughput_10min.csv"
SUMMARY = "helios_cluster_summary.csv"
QUOTAS = "venus_cluster_gpu_number.csv"
BIN_S = 600.0
RUNTIME_BOUNDS_S = (10.0, 30 * 86400.0)


class _Uniforms:
    """Uniform draws handed out one at a time from seeded batches (numpy per-call cost is high)."""

    def __init__(self, rng: np.random.Generator, batch: int = 65536):
        self.rng, self.batch = rng, batch
        self.buf: list[float] = []
        self.pos = 0

    def next(self) -> float:
        if self.pos == len(self.buf):
            self.buf, self.pos = self.rng.random(self.batch).tolist(), 0
        self.pos += 1
        return self.buf[self.pos - 1]


def _split_gpus(u: _Uniforms, n: int, total: int) -> tuple[list[int], int]:
    """Split ``total`` GPUs over ``n`` jobs (each >= 1, <= MAX_GPUS), heavy-tailed.

    Every job starts at 1; each step grows one job to its next power of two, picking the job
    with probability proportional to its size, so a few jobs get big and most stay at 1 (as in
    every published GPU-cluster trace). Returns the sizes and GPUs that did not fit.
    """
    sizes = [1] * n
    extra = total - n
    while extra > 0:
        weight = sum(s for s in sizes if s < MAX_GPUS)
        if weight == 0:
            break
        x = u.next() * weight
        j = 0
        for j, s in enumerate(sizes):  # noqa: B007 - j is the pick
            if s < MAX_GPUS:
                x -= s
                if x < 0:
                    break
        if sizes[j] >= MAX_GPUS:  # float round-off ran past the last open job
            j = max(i for i, s in enumerate(sizes) if s < MAX_GPUS)
        cur = sizes[j]
        nxt = 1 << cur.bit_length()  # next power of two above cur
        inc = min(min(nxt, MAX_GPUS) - cur, extra)
        sizes[j] += inc
        extra -= inc
    return sizes, max(extra, 0)


def load_helios(traces_dir: Path, *, seed: int = 0) -> Trace:
    path = traces_dir / DIR / SERIES
    cols, rows = read_csv(path, ("time", "submit_gpu_job", "submit_gpu_num"))
    try:
        stamps = np.array(column(rows, cols["time"]), dtype="datetime64[s]").astype(np.int64)
        jobs_per_bin = np.array(column(rows, cols["submit_gpu_job"]), dtype=int)
        gpus_per_bin = np.array(column(rows, cols["submit_gpu_num"]), dtype=int)
    except ValueError as exc:
        raise ValueError(f"{path}: unparsable value: {exc}") from None
    if (gpus_per_bin < jobs_per_bin).any():
        k = int(np.flatnonzero(gpus_per_bin < jobs_per_bin)[0])
        raise ValueError(f"{path}: row {k + 2} has fewer GPUs than GPU jobs")

    median_s, mean_s = _venus_runtime(traces_dir / DIR / SUMMARY)
    sigma = math.sqrt(2.0 * math.log(mean_s / median_s)) if mean_s > median_s else 0.0
    vcs, quota = _venus_quotas(traces_dir / DIR / QUOTAS)

    f = Filler(seed)
    rng = f.rng("helios_bodies")
    bins = np.flatnonzero(jobs_per_bin > 0)
    sizes: list[int] = []
    lost = 0
    u = _Uniforms(rng)
    for b in bins.tolist():
        s, left = _split_gpus(u, int(jobs_per_bin[b]), int(gpus_per_bin[b]))
        sizes.extend(s)
        lost += left
    n = len(sizes)
    bin_of_job = np.repeat(bins, jobs_per_bin[bins])
    submit = (stamps[bin_of_job] - stamps[0]).astype(float) + rng.uniform(0, BIN_S, n)
    runtime = np.clip(np.round(rng.lognormal(math.log(median_s), sigma, n)), *RUNTIME_BOUNDS_S)
    f.note(
        f"helios: Venus {len(rows)} ten-minute bins; {n} GPU jobs = the series' submit_gpu_job "
        f"total; {int(gpus_per_bin.sum())} GPUs submitted, {lost} not placed (cap {MAX_GPUS})"
    )
    f.note("helios: each job arrives uniformly at random within its 10-minute bin (seeded)")
    f.note(
        "helios: a bin's submitted GPUs are split over its jobs, each >= 1, growing jobs to the "
        "next power of two with probability proportional to size (heavy tail, seeded)"
    )
    f.note(
        f"helios: runtime lognormal with Venus GPU-job median {median_s:g} s and mean "
        f"{mean_s:g} s (sigma {sigma:.2f}), clipped to {RUNTIME_BOUNDS_S[0]:g}-"
        f"{RUNTIME_BOUNDS_S[1]:g} s"
    )
    f.note("helios: tenant = a Venus VC drawn with weight = its mean daily GPU quota")
    f.note(reference_runtime_note("Helios Venus"))
    return assemble(
        name="helios",
        source="helios:venus",
        filler=f,
        ids=[f"helios-{i}" for i in range(n)],
        submit_s=submit,
        gpus=np.array(sizes, dtype=float),
        runtime_s=runtime,
        tenants=f.tenants(n, vcs, quota).tolist(),
    )


def _venus_runtime(path: Path) -> tuple[float, float]:
    cols, rows = read_csv(path, ("id", "med_run_time_gpu", "avg_run_time_gpu"))
    for r in rows:
        if r[cols["id"]] == "Venus":
            return float(r[cols["med_run_time_gpu"]]), float(r[cols["avg_run_time_gpu"]])
    raise ValueError(f"{path}: no Venus row")


def _venus_quotas(path: Path) -> tuple[list[str], list[float]]:
    with open(path, encoding="utf-8") as fh:
        header = fh.readline().strip().split(",")
    cols, rows = read_csv(path, ("date",))
    vcs = [h for h in header if h not in ("date", "total")]
    mean = [float(np.mean([float(r[cols[v]]) for r in rows])) for v in vcs]
    keep = [(v, q) for v, q in zip(vcs, mean, strict=True) if q > 0]
    if not keep:
        raise ValueError(f"{path}: no VC with a positive GPU quota")
    return [v for v, _ in keep], [q for _, q in keep]
