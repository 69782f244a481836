"""``random``: FGD's random-fit baseline (Weng et al., ATC'23), for the fill experiment.

A node drawn uniformly among those where the task fits now; inside it, a fractional task takes
a GPU drawn uniformly among those with its share free, a k-GPU task the lowest-numbered free
GPUs (the paper does not say how random-fit picks GPUs inside a node). Seeded by the run's seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from libs.policy.cluster import EPS
from libs.policy.config import PolicyConfig
from libs.sim.fill_policy import Choice, FillPolicy, fractional_slots, lowest_whole
from proto.jobs import JobSpec
from proto.nodes import NodeSpec


class RandomFit(FillPolicy):
    name = "random"

    def attach(self, nodes: Sequence[NodeSpec], *, seed: int, cfg: PolicyConfig) -> None:
        super().attach(nodes, seed=seed, cfg=cfg)
        self.rng = np.random.default_rng([seed, 7])

    def choose(self, spec: JobSpec, fit: np.ndarray) -> Choice | None:
        n = int(self.rng.choice(np.flatnonzero(fit)))
        if spec.gpus <= 0:
            return n, (), 0.0
        if spec.gpus < 1.0 - EPS:
            cand = fractional_slots(self.view, n, float(spec.gpus))
            return n, (int(self.rng.choice(cand)),), float(spec.gpus)
        return n, lowest_whole(self.view, n, round(spec.gpus)), 1.0
