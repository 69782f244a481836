"""The truth of a replay: each job's runtime on each GPU model, read from the trace where it
measured one and from the profile table otherwise (what the engine charges; what a policy is
told is the job's own ``est_runtime_s``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def runtime_matrix(trace_jobs: Sequence[Any], models: list[str], profiles: Any) -> np.ndarray:
    """R[j, m]: runtime of job j on models[m] (trace figure first, profile otherwise).

    Profile runtimes are ``est_runtime_s / speed(model, class)`` for every job at once; only jobs
    whose trace measured per-model runtimes are looked at one by one. The truth: a noisy
    estimate's factor (``TraceJob.est_factor``) is divided out.
    """
    n = len(trace_jobs)
    out = np.empty((n, len(models)))
    classes = sorted({tj.spec.workload_class for tj in trace_jobs})
    cls_pos = {c: i for i, c in enumerate(classes)}
    if n:
        est = np.array(
            [tj.spec.est_runtime_s / getattr(tj, "est_factor", 1.0) for tj in trace_jobs],
            dtype=float,
        )
        cls = np.array([cls_pos[tj.spec.workload_class] for tj in trace_jobs], dtype=np.int64)
        for m, model in enumerate(models):
            speeds = np.array([float(profiles.speed(model, c)) for c in classes])
            out[:, m] = est / speeds[cls]
    for j, tj in enumerate(trace_jobs):
        if tj.runtime_by_model:
            for m, model in enumerate(models):
                r = tj.runtime_by_model.get(model)
                if r is not None:
                    out[j, m] = r
    if not np.all(np.isfinite(out)) or np.any(out <= 0):
        bad = int(np.argwhere(~np.isfinite(out) | (out <= 0))[0][0])
        raise ValueError(f"job {trace_jobs[bad].spec.id}: runtime must be a positive number")
    return out
