"""The failure model: what happens to a job placed where its GPU memory does not fit.

Count-only schedulers (Kubernetes' default ``nvidia.com/gpu`` counting, the seed's original
strategy) bind a pod to any node with enough free GPUs; a model that needs 40 GB then dies with
CUDA OOM on a 16 GB T4 shortly after start, while it loads weights and allocates its first
batch. We model that as: the attempt fails after ``min(runtime on that GPU, oom_after_s)``
(default 5 minutes), the job is resubmitted after ``resubmit_delay_s`` (default 30 s, a
controller's restart back-off), and after ``max_attempts`` attempts (default 3) it ends Failed.
The GPU time of a failed attempt is spent (allocated, powered) but does no work.

Memory "does not fit" means: on some GPU of the allocation, the GPU memory requested by every job
sharing it exceeds the GPU's memory (``SimCluster.allocate`` decides).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FailureModel:
    oom_after_s: float = 300.0
    resubmit_delay_s: float = 30.0
    max_attempts: int = 3

    def __post_init__(self) -> None:
        if self.oom_after_s <= 0 or self.resubmit_delay_s < 0 or self.max_attempts < 1:
            raise ValueError(
                "failure model: oom_after_s > 0, resubmit_delay_s >= 0, max_attempts >= 1"
            )

    def attempt_duration_s(self, runtime_s: float, memory_fits: bool) -> tuple[float, bool]:
        """How long the attempt holds its GPUs, and whether it ends in OOM."""
        if memory_fits:
            return runtime_s, False
        return min(runtime_s, self.oom_after_s), True

    def gives_up(self, attempts: int) -> bool:
        """After this many failed attempts, the job ends Failed."""
        return attempts >= self.max_attempts
