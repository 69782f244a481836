"""What the engine samples while it runs: utilization, queue length and fragmentation over
time (``SimResult.samples_*``, the runner's plots), about ``samples`` points over the arrivals.

Fragmentation is the share of free GPU capacity that no pending job's shape could use
(memory-aware), NaN when nothing waits or nothing is free.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from libs.sim.cluster import EPS, SimCluster


class Samples:
    """The time series of one run, taken at most every ``step_s``."""

    def __init__(self, t0: float, step_s: float) -> None:
        self.t: list[float] = []
        self.util: list[float] = []
        self.queue: list[int] = []
        self.frag: list[float] = []
        self.next_s = t0
        self.step_s = step_s

    def due(self, t: float) -> bool:
        return t >= self.next_s

    def take(self, t: float, util: float, queued: int, frag: float) -> None:
        self.t.append(t)
        self.util.append(util)
        self.queue.append(queued)
        self.frag.append(frag)
        self.next_s = t + self.step_s

    def arrays(self) -> dict[str, np.ndarray]:
        """The ``SimResult`` fields."""
        return {
            "samples_t": np.array(self.t),
            "samples_util": np.array(self.util),
            "samples_queue": np.array(self.queue),
            "samples_frag": np.array(self.frag),
        }


def fragmentation(c: SimCluster, shapes: Iterable[tuple[float, float]], queued: int) -> float:
    """Share of free GPU capacity that no pending job could use (memory-aware), or NaN;
    ``shapes``: the pending jobs' (GPUs, GPU memory) pairs."""
    free_share = c.free_share.sum(axis=1)
    total_free = float(free_share.sum())
    if not queued or total_free < 1e-6:
        return float("nan")
    free_whole = c.free_whole()
    max_frac = c.free_share.max(axis=1)
    spare_mem = (c.gpu_mem_gb[:, None] - c.mem_used_gb).max(axis=1)
    usable = np.zeros(len(c.nodes), dtype=bool)
    widest = int(c.gpu_count.max())
    for gpus, mem in shapes:
        if gpus < 1.0:
            usable |= (max_frac >= gpus - EPS) & (spare_mem >= mem - EPS)
        elif gpus <= widest:
            usable |= (free_whole >= gpus) & (c.gpu_mem_gb >= mem - EPS)
        elif free_whole.sum() >= gpus:
            usable |= (free_whole > 0) & (c.gpu_mem_gb >= mem - EPS)
    return float(free_share[~usable].sum() / total_free)
