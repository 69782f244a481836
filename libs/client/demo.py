"""A seeded demo workload: a steady stream of varied jobs for ``mosaic up --demo``.

Why this mix: the demo should exercise every trade-off the scheduler weighs on the default
cluster (A100-80GB, V100-32GB, T4-16GB nodes): jobs that only fit on big-memory GPUs (> 16 GB,
> 32 GB per GPU), fractional inference jobs, 8-GPU gangs, high priorities, deadlines, energy-
sensitive and elastic/checkpointable jobs. Runtimes are 5-60 minutes of Mosaic time, so at the
default 60x clock they finish in 5 s to a minute of wall time.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator

from libs.client.api import ClientError
from proto.jobs import Elastic, JobSpec

CLASSES: tuple[tuple[str, float], ...] = (
    ("cnn", 0.25),
    ("transformer", 0.25),
    ("rnn", 0.12),
    ("recommendation", 0.13),
    ("inference", 0.25),
)
SIZES: tuple[tuple[float, float], ...] = ((0.5, 0.12), (1, 0.33), (2, 0.25), (4, 0.18), (8, 0.12))
TENANTS: tuple[str, ...] = ("vision", "nlp", "recsys", "speech", "research")
# GPU memory per GPU (GB) by class: (choices, weights). > 16 GB rules out T4, > 32 GB V100.
GPU_MEM_GB: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "cnn": ((6, 12, 24), (0.4, 0.4, 0.2)),
    "transformer": ((14, 30, 40, 70), (0.25, 0.3, 0.25, 0.2)),
    "rnn": ((4, 8, 12), (0.4, 0.4, 0.2)),
    "recommendation": ((10, 20, 36), (0.4, 0.4, 0.2)),
    "inference": ((4, 8, 14), (0.4, 0.4, 0.2)),
}
MIN_RUNTIME_S = 300.0
MAX_RUNTIME_S = 3600.0


def _pick(rng: random.Random, table: tuple[tuple[object, float], ...]) -> object:
    return rng.choices([v for v, _ in table], weights=[w for _, w in table])[0]


def make_job(rng: random.Random, job_id: str, now: float) -> JobSpec:
    """One demo job; ``now`` is the Mosaic clock (deadlines are absolute on it)."""
    cls = str(_pick(rng, CLASSES))
    inference = cls == "inference"
    gpus = float(rng.choice((0.5, 1.0)) if inference else _pick(rng, SIZES))
    mems, weights = GPU_MEM_GB[cls]
    gpu_mem_gb = float(rng.choices(mems, weights=weights)[0])
    if gpus < 1:
        gpu_mem_gb = min(gpu_mem_gb, 8.0)  # half a T4 still holds it
    whole = max(1, int(gpus))
    # log-uniform between 5 and 60 minutes: many short jobs, a few long ones
    runtime_s = MIN_RUNTIME_S * (MAX_RUNTIME_S / MIN_RUNTIME_S) ** rng.random()
    priority = rng.choices(range(10), weights=(3, 4, 6, 8, 10, 12, 8, 5, 3, 2))[0]
    if inference and rng.random() < 0.5:
        priority = max(priority, 7)
    deadline = None
    if inference or rng.random() < 0.25:
        deadline = now + runtime_s * rng.uniform(1.5, 4.0) + 120.0
    energy = (
        round(rng.uniform(0.6, 1.0), 2) if rng.random() < 0.25 else round(rng.uniform(0, 0.3), 2)
    )
    checkpointable = not inference and rng.random() < 0.5
    elastic = None
    if not inference and whole >= 2 and rng.random() < 0.4:
        elastic = Elastic(min_gpus=max(1, whole // 2), max_gpus=min(8, whole * 2))
    return JobSpec(
        id=job_id,
        tenant=rng.choice(TENANTS),
        priority=priority,
        gpus=gpus,
        gpu_mem_gb=gpu_mem_gb,
        host_mem_gb=float(min(240, 8 * whole + rng.choice((0, 8, 16)))),
        cpus=float(min(32, 4 * whole)),
        workload_class=cls,  # type: ignore[arg-type]
        deadline=deadline,
        energy_sensitivity=energy,
        elastic=elastic,
        checkpointable=checkpointable,
        est_runtime_s=round(runtime_s, 1),
        kind="inference" if inference else "training",
    )


def jobs(seed: int, now: Callable[[], float], prefix: str = "demo") -> Iterator[JobSpec]:
    """An endless, reproducible sequence of demo jobs (ids ``<prefix>-00000``, ...)."""
    rng = random.Random(seed)
    i = 0
    while True:
        yield make_job(rng, f"{prefix}-{i:05d}", now())
        i += 1


class DemoGenerator:
    """Posts demo jobs through a ``submit`` callable at ``rate_per_s`` jobs per wall second."""

    def __init__(
        self,
        submit: Callable[[JobSpec], object],
        *,
        now: Callable[[], float],
        seed: int = 0,
        rate_per_s: float = 1.0,
        prefix: str = "demo",
    ):
        if rate_per_s <= 0:
            raise ValueError(f"demo rate must be > 0 jobs/s, got {rate_per_s}")
        self.submit = submit
        self.rate_per_s = rate_per_s
        self.submitted = 0
        self.refused: list[str] = []
        self._jobs = jobs(seed, now, prefix)
        self._next_at = time.monotonic()

    def due(self) -> int:
        """How many jobs are due by now (steady rate, catching up after a slow tick)."""
        n = 0
        t = time.monotonic()
        while self._next_at <= t:
            n += 1
            self._next_at += 1.0 / self.rate_per_s
        return n

    def step(self) -> int:
        """Submit every due job; returns how many were submitted. Refusals (and an unreachable
        gateway) are recorded, not raised: a demo keeps going, and the summary reports them."""
        done = 0
        for _ in range(self.due()):
            spec = next(self._jobs)
            try:
                self.submit(spec)
                self.submitted += 1
                done += 1
            except ClientError as exc:
                self.refused.append(f"{spec.id}: {exc}")
        return done
