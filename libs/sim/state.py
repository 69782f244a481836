"""Per-job state inside one simulation, and the record a run leaves behind.

Kept apart from the engine so that policies and metrics can import the types without the loop.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from proto.jobs import JobSpec
from proto.ledger import Allocation

PENDING = "pending"
RUNNING = "running"
BACKOFF = "backoff"  # failed attempt, waiting to be resubmitted
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"  # an inference replica the scaler stopped (libs.sim.serving)
TERMINAL = (COMPLETED, FAILED, CANCELLED)


@dataclass(eq=False, slots=True)
class SimJob:
    """One job's life in the simulator. ``runtime_s[m]`` is its runtime on ``models[m]``."""

    idx: int
    spec: JobSpec
    submit_s: float
    runtime_s: np.ndarray
    fastest_runtime_s: float
    state: str = PENDING
    attempts: int = 0
    failed_attempts: int = 0
    enqueue_s: float = 0.0
    wait_s: float = 0.0
    first_start_s: float = -1.0
    start_s: float = -1.0
    end_s: float = -1.0
    run_s: float = 0.0  # all attempts, successful or not
    attained_gpu_s: float = 0.0
    energy_active_j: float = 0.0  # above idle, all attempts
    allocs: list[Allocation] = field(default_factory=list)
    model: str = ""  # GPU model of the current / last attempt
    oom: bool = False  # current attempt will die with OOM
    token: int = 0  # invalidates stale finish events
    reason: str = ""
    terminal_count: int = 0  # must end at exactly 1
    # moves (libs.sim.moves): work done so far (0..1, kept by a checkpoint), when the job was
    # last checkpointed and requeued (-1: it runs or never moved), how long each resume took
    progress: float = 0.0
    preempted_at_s: float = -1.0
    moves: int = 0
    migrations: int = 0
    resume_delays_s: list[float] = field(default_factory=list)
    ckpt_start_s: float = -1.0  # a checkpoint under way since then (-1: none)
    ckpt_kind: str = ""  # that checkpoint's move kind (preempt | migrate)
    ckpt_shrink_to: int = 0  # that checkpoint's shrink (elastic: GPUs it resumes on; 0: none)
    shrinks: int = 0  # times it was shrunk (libs.policy.stages.shrink)
    grows: int = 0  # times it grew back (libs.policy.stages.grow)
    attempt_full_s: float = 0.0  # the whole job's runtime on the current attempt's GPUs
    est_factor: float = 1.0  # spec.est_runtime_s = truth x this (libs.sim.loaders.noise)

    @property
    def gpus(self) -> float:
        return self.spec.gpus

    @property
    def priority(self) -> int:
        return self.spec.priority


Assignment = tuple[SimJob, list[Allocation]]


class Policy(Protocol):
    """A scheduling policy as the engine drives it: one pass per coalesced event.

    ``schedule`` returns the jobs to start now and where; the engine checks and commits them.
    ``attach`` is called once before the run; ``started``/``ended`` after each attempt starts and
    ends (for policies that keep their own usage accounts).
    """

    name: str

    def attach(self, ctx: SimContext) -> None: ...

    def can_ever_place(self, job: SimJob) -> bool: ...

    def enqueued(self, job: SimJob, now: float) -> None: ...

    def schedule(
        self, queue: Collection[SimJob], view, running: Collection[SimJob], now: float
    ) -> list[Assignment]: ...

    def started(self, job: SimJob, now: float) -> None: ...

    def ended(self, job: SimJob, now: float) -> None: ...


@dataclass
class SimContext:
    """What a policy may know about the run: the cluster, the models and the runtime matrix."""

    cluster: object  # SimCluster
    models: list[str]
    profiles: object
    jobs: Sequence[SimJob]


@dataclass
class SimResult:
    """Everything metrics and plots need from one policy's run."""

    policy: str
    jobs: list[SimJob]
    capacity_gpus: float
    idle_power_w: float  # all GPUs idle
    t0_s: float
    t_end_s: float
    alloc_gpu_s: float  # integral of allocated GPUs over [t0, t_end]
    busy_s: float  # time with allocated + pending demand >= capacity
    busy_alloc_gpu_s: float
    samples_t: np.ndarray
    samples_util: np.ndarray
    samples_queue: np.ndarray
    samples_frag: np.ndarray  # NaN where no job was pending or no GPU free
    events: int
    passes: int
    wall_s: float
    node_models: dict[str, str] = field(default_factory=dict)
    # power saving (engine.Engine, for policies with ``power_step``): idle energy not drawn
    # because nodes were suspended, suspended node-seconds, and the cluster's idle draw at
    # the end of the run (what the rest of a common window costs)
    idle_saved_j: float = 0.0
    node_suspend_s: float = 0.0
    end_idle_power_w: float | None = None
    # moves the policy ordered on a job that is neither checkpointable nor elastic: the engine
    # refuses them and counts them here (must be 0)
    preempted_non_checkpointable: int = 0
