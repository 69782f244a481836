"""Noisy runtime estimates: what the policy is told, not what the job does (issue 15).

A trace's ``est_runtime_s`` is the job's true runtime on the reference GPU, so a policy that
reads it is clairvoyant. ``noisy_estimates`` multiplies each job's estimate by a lognormal
factor ``exp(sigma * z)``, ``z ~ N(0, 1)``, and records the factor on the job
(``TraceJob.est_factor``); the engine's truth (``runtimes.runtime_matrix``) and the metrics' work
figure divide it back out, so only the policy's view changes.

**Median one, not mean one.** ``log factor`` has mean 0: a job is as likely to be
over-estimated by a factor k as under-estimated by it, and the typical job's estimate is right.
A mean-one factor (``exp(sigma * z - sigma**2 / 2)``) would add a bias to the spread: at
sigma = 1 its median is 0.61 and 69% of the jobs would look shorter than they are, so a result
could not say whether the noise or the bias moved it. The price is that the sum of the
estimates grows by ``exp(sigma**2 / 2)`` (1.13x at 0.5, 1.65x at 1.0); the load scaling uses
the truth, so the offered load does not move.

**A job's factor depends on the seed and its id only** (a hash, not a draw in trace order):
the first N jobs of a trace get the same factors in a short replay as in the full one, and a
job dropped or added elsewhere does not shift every later job's noise.
"""

from __future__ import annotations

import argparse
import hashlib
import math
from collections.abc import Sequence

import msgspec
import numpy as np
from scipy.special import ndtri

from libs.sim.trace import TraceJob
from proto.validation import HORIZON_S

KIND = "lognormal, median one: estimate = truth x exp(sigma z), z ~ N(0, 1) from (seed, job id)"
_SALT = b"mosaic/estimate-noise/v1"


def check_sigma(sigma: float) -> float:
    """``sigma`` as a float, refused when negative or not finite (0 means no noise)."""
    s = float(sigma)
    if not math.isfinite(s) or s < 0:
        raise ValueError(f"estimate noise sigma must be a finite number >= 0, got {sigma}")
    return s


def standard_normals(job_ids: Sequence[str], seed: int) -> np.ndarray:
    """One N(0, 1) value per job id, fixed by (seed, id): a uniform from a keyed hash, mapped
    through the inverse normal CDF (so no draw order and no shared generator state)."""
    key = hashlib.blake2b(_SALT + str(int(seed)).encode(), digest_size=16).digest()
    u = np.empty(len(job_ids))
    for i, job_id in enumerate(job_ids):
        h = hashlib.blake2b(job_id.encode(), digest_size=8, key=key).digest()
        # 53 bits into (0, 1), never 0 or 1 (ndtri would give -inf / inf)
        u[i] = ((int.from_bytes(h, "little") >> 11) + 0.5) / float(1 << 53)
    return ndtri(u)


def noise_factors(job_ids: Sequence[str], sigma: float, seed: int) -> np.ndarray:
    """The factor each job's estimate is multiplied by: ``exp(sigma * z)`` (all 1 at 0)."""
    s = check_sigma(sigma)
    if s == 0 or not job_ids:
        return np.ones(len(job_ids))
    return np.exp(s * standard_normals(job_ids, seed))


def noisy_estimates(jobs: Sequence[TraceJob], sigma: float, seed: int) -> list[TraceJob]:
    """``jobs`` with each ``spec.est_runtime_s`` x its factor and the factor on ``est_factor``
    (multiplied onto any factor already there). ``sigma == 0`` returns the jobs unchanged."""
    if check_sigma(sigma) == 0:
        return list(jobs)
    factors = noise_factors([j.spec.id for j in jobs], sigma, seed).tolist()
    out = []
    for j, f in zip(jobs, factors, strict=True):
        # no submission may state more than the horizon (proto.validation): clip there
        est_s = min(j.spec.est_runtime_s * f, HORIZON_S)
        spec = msgspec.structs.replace(j.spec, est_runtime_s=est_s)
        out.append(
            msgspec.structs.replace(
                j, spec=spec, est_factor=j.est_factor * est_s / j.spec.est_runtime_s
            )
        )
    return out


def noise_report(jobs: Sequence[TraceJob], sigma: float, seed: int) -> dict:
    """What ``results.json`` records: the setting and the spread the jobs actually got."""
    logs = np.log([j.est_factor for j in jobs]) if jobs else np.zeros(0)
    return {
        "sigma": float(sigma),
        "seed": int(seed),
        "kind": KIND,
        "log_factor_mean": float(logs.mean()) if logs.size else 0.0,
        "log_factor_std": float(logs.std()) if logs.size else 0.0,
        "share_under_estimated": float((logs < 0).mean()) if logs.size else 0.0,
    }


def add_noise_args(ap: argparse.ArgumentParser) -> None:
    """``--estimate-noise SIGMA`` for ``python -m libs.sim.runner`` and ``mosaic sim``."""
    ap.add_argument(
        "--estimate-noise",
        type=float,
        default=0.0,
        metavar="SIGMA",
        help="multiply each job's runtime estimate (what the policy sees) by a lognormal factor "
        "of median 1 and this log-sigma, seeded by --seed; true runtimes unchanged (0 = off)",
    )
