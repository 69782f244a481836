"""A small Gavel-style heterogeneous workload for the published LAS check, built in the tests
(no generator is assumed): Gavel's recipe (OSDI'20, section 7.1) at a small scale.

Job types and their measured steps per second on V100, P100 and K80 are read from Gavel's
``simulation_throughputs.json`` (1-GPU entries, isolated); each job's duration on a V100 is
10^x minutes with x uniform in [1.5, 3] (80%) or [3, 4] (20%), as the paper samples; arrivals
are Poisson. Every job is checkpointable (Gavel preempts every job between rounds).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.sim.helpers import TJ, job, node

MODELS = {"v100": "v100-32gb", "p100": "p100", "k80": "k80"}


def throughput_table(traces_dir: Path) -> dict[str, dict[str, float]]:
    """job type -> {our GPU model: steps/s} for every 1-GPU job type measured on all three."""
    raw = json.loads((traces_dir / "gavel" / "simulation_throughputs.json").read_text())
    out: dict[str, dict[str, float]] = {}
    for key in raw["v100"]:
        if not key.endswith(", 1)"):
            continue
        got = {MODELS[t]: float(raw[t].get(key, {}).get("null", 0.0)) for t in MODELS}
        if all(v > 0 for v in got.values()):
            out[key] = got
    return out


def workload(traces_dir: Path, n_jobs: int, jobs_per_h: float, seed: int) -> list[TJ]:
    table = throughput_table(traces_dir)
    kinds = sorted(table)
    rng = np.random.default_rng(seed)
    t = 0.0
    out: list[TJ] = []
    for i in range(n_jobs):
        t += rng.exponential(3600.0 / jobs_per_h)
        long = rng.random() < 0.2
        minutes = 10 ** (rng.uniform(3, 4) if long else rng.uniform(1.5, 3))
        thr = table[kinds[int(rng.integers(len(kinds)))]]
        steps = minutes * 60.0 * thr["v100-32gb"]
        by_model = {m: steps / v for m, v in thr.items()}
        out.append(
            job(f"g{i}", t, by_model["v100-32gb"], checkpointable=True, runtime_by_model=by_model)
        )
    return out


def cluster(nodes_per_type: int, gpus_per_node: int = 4) -> list:
    """Gavel's simulated cluster is 36 V100, 36 P100 and 36 K80: ``cluster(9)``."""
    return [
        node(f"{m}-{i}", model=m, gpus=gpus_per_node, mem=16.0)
        for m in MODELS.values()
        for i in range(nodes_per_type)
    ]
