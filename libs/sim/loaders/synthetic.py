"""A seeded synthetic trace that needs no files: the demo's and the tests' default workload.

Why: the public traces live outside the checkout and may be absent; a simulator run must still
be possible, reproducible (same seed, same jobs) and exercise every scheduler feature: mixed
sizes, fractional inference, GPU-type constraints, priorities, deadlines, elastic jobs.
"""

from __future__ import annotations

import numpy as np

from libs.sim.loaders.assemble import assemble
from libs.sim.loaders.fill import Filler
from libs.sim.trace import REFERENCE_MODEL, Trace

DEFAULT_JOBS = 1000
MEAN_INTERARRIVAL_S = 60.0
# (gpus, probability); fractional sizes are inference jobs
SIZES: tuple[tuple[float, float], ...] = (
    (0.25, 0.05),
    (0.5, 0.07),
    (1, 0.58),
    (2, 0.10),
    (4, 0.10),
    (8, 0.08),
    (16, 0.02),
)
WHOLE_GPU_INFERENCE_SHARE = 0.05  # of 1-GPU jobs
RUNTIME_MEDIAN_S = 1800.0
RUNTIME_SIGMA = 1.4
RUNTIME_BOUNDS_S = (60.0, 7 * 86400.0)
CONSTRAINT_SHARE = 0.06
CONSTRAINTS: tuple[tuple[str, ...], ...] = (("a100",), ("v100",), ("t4",), ("a100", "v100"))
TENANTS: tuple[tuple[str, float], ...] = (
    ("team-vision", 0.35),
    ("team-nlp", 0.30),
    ("team-recsys", 0.15),
    ("team-serving", 0.12),
    ("team-research", 0.08),
)


def load_synthetic(n_jobs: int = DEFAULT_JOBS, *, seed: int = 0) -> Trace:
    if n_jobs < 0:
        raise ValueError(f"synthetic trace needs n_jobs >= 0, got {n_jobs}")
    rng = np.random.default_rng([seed, 0x5E7])
    f = Filler(seed)
    f.note(
        f"synthetic: {n_jobs} jobs, Poisson arrivals with mean gap {MEAN_INTERARRIVAL_S:g} s, "
        f"seed {seed}"
    )
    f.note("synthetic: GPU sizes " + " ".join(f"{g:g}:{p:.0%}" for g, p in SIZES))
    f.note(
        f"synthetic: runtime on {REFERENCE_MODEL} lognormal, median {RUNTIME_MEDIAN_S:g} s, "
        f"sigma {RUNTIME_SIGMA:g}, clipped to {RUNTIME_BOUNDS_S[0]:g}-{RUNTIME_BOUNDS_S[1]:g} s"
    )
    f.note(
        f"synthetic: fractional jobs and {WHOLE_GPU_INFERENCE_SHARE:.0%} of 1-GPU jobs are "
        f"inference; {CONSTRAINT_SHARE:.0%} of jobs carry a GPU-type constraint from "
        + ", ".join("|".join(c) for c in CONSTRAINTS)
    )
    submit = np.cumsum(rng.exponential(MEAN_INTERARRIVAL_S, n_jobs))
    submit = submit - submit[0] if n_jobs else submit
    sizes = np.array([g for g, _ in SIZES])
    p = np.array([w for _, w in SIZES])
    gpus = rng.choice(sizes, size=n_jobs, p=p / p.sum())
    runtime = np.clip(
        np.round(rng.lognormal(np.log(RUNTIME_MEDIAN_S), RUNTIME_SIGMA, n_jobs)),
        *RUNTIME_BOUNDS_S,
    )
    infer = (gpus < 1) | ((gpus == 1) & (rng.random(n_jobs) < WHOLE_GPU_INFERENCE_SHARE))
    has_cons = rng.random(n_jobs) < CONSTRAINT_SHARE
    pick = rng.integers(0, len(CONSTRAINTS), n_jobs)
    constraints = [
        CONSTRAINTS[k] if c else () for c, k in zip(has_cons.tolist(), pick.tolist(), strict=True)
    ]
    tenants = f.tenants(n_jobs, [t for t, _ in TENANTS], [w for _, w in TENANTS]).tolist()
    f.note("synthetic: tenants drawn seeded from " + ", ".join(f"{t} {w:.0%}" for t, w in TENANTS))
    return assemble(
        name="synthetic",
        source="synthetic",
        filler=f,
        ids=[f"syn-{i}" for i in range(n_jobs)],
        submit_s=submit,
        gpus=gpus,
        runtime_s=runtime,
        tenants=tenants,
        kind=["inference" if x else "training" for x in infer.tolist()],
        constraints=constraints,
    )
