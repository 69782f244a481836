"""Pick (Kubernetes "Score" weights + the choice of a node), the definitions: how the score
terms of ``stages.score`` are weighed for a job (``term_weights``) and which feasible node wins
(``pick``): the best weighted total, where totals within ``SCORE_TIE`` of the best are a tie
won by the first feasible node. ``placement.place`` applies them through one compiled loop
(``fast.score_nodes``), checked against these (``tests/policy/test_kernels.py``).
"""

from __future__ import annotations

import numpy as np

from libs.policy.config import PolicyConfig
from proto.jobs import JobSpec

# the score terms, each defined in libs.policy.stages.score (s_speed, s_energy, s_pack,
# s_thermal, s_memory_fit), in the order ``place`` weighs and sums them
TERMS: tuple[str, ...] = ("speed", "energy", "pack", "thermal", "memory_fit")
# Totals this close are a tie, won by the first feasible node (scores lie in [0, 1]). Which of
# two equally good nodes wins must not depend on the last bits of a sum: numpy's pairwise and
# BLAS sums and a compiled loop's sums round differently, and BLAS builds differ between CPUs.
# Measured on Philly: with a strict arg-max, the compiled sums first picked another node at the
# 2,830th placement, a tie decided by rounding, and the replay diverged from there.
SCORE_TIE = 1e-9


def term_weights(spec: JobSpec, green: float, cfg: PolicyConfig) -> tuple[float, ...]:
    """The weight of each term of ``TERMS`` for this job. ``green``: its green tolerance
    (``scores.green_tolerance``). Speed counts more for a long job (runtime over
    ``speed_runtime_scale_s``, at least 1) and less for a green one, energy only for a green
    one."""
    length = max(1.0, spec.est_runtime_s / cfg.speed_runtime_scale_s)
    return (  # in TERMS order
        cfg.w_speed * length * (1.0 - cfg.green_speed_relief * green),
        cfg.w_energy * green * (length if cfg.green_energy_scales else 1.0),
        cfg.w_pack,
        cfg.w_thermal,
        cfg.w_memory_fit,
    )


def pick(total: np.ndarray) -> int:
    """The index of the chosen node among the feasible ones: the first whose total lies within
    ``SCORE_TIE`` of the best (with a NaN total, the first NaN, as ``np.argmax``)."""
    nan = np.isnan(total)
    if nan.any():
        return int(np.flatnonzero(nan)[0])
    return int(np.flatnonzero(total >= total.max() - SCORE_TIE)[0])
