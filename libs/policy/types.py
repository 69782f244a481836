"""Records the policy functions take and return: pending and running jobs, placements, refusals.

Plain frozen dataclasses (not wire types): they never cross NATS. The services turn them into
``proto.decisions`` records at the edge.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from proto.jobs import JobSpec
from proto.ledger import Allocation


@dataclass(frozen=True, slots=True)
class PendingJob:
    """A job waiting to start. ``progress`` (0..1) is the share of work already done (after a
    preemption with checkpoint), so only the rest counts towards urgency."""

    spec: JobSpec
    enqueued_at: float
    attempt: int = 1
    progress: float = 0.0
    # a moved job (checkpointed and requeued) must start again by then (Mosaic clock)
    resume_by: float | None = None

    @property
    def urgency_deadline(self) -> float | None:
        """The deadline the rank stage's urgency term reads: the job's own, or for a moved job
        its resume deadline plus its remaining reference runtime, whichever comes first. So a
        moved job's priority rises as its resume deadline nears, by the same urgency rule as a
        deadline (``stages.rank``), and stays put for every job that was never moved."""
        own = self.spec.deadline
        if self.resume_by is None:
            return own
        by = self.resume_by + self.spec.est_runtime_s * max(0.0, 1.0 - self.progress)
        return by if own is None else min(own, by)


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job holding resources, with when it is expected to end (for backfill reservations)."""

    spec: JobSpec
    node_index: int
    gpu_indices: tuple[int, ...]
    gpu_share: float
    expected_end: float

    @classmethod
    def from_allocation(
        cls, alloc: Allocation, node_index: int, expected_end: float, spec: JobSpec | None = None
    ) -> RunningJob:
        s = spec if spec is not None else alloc.spec
        if s is None:
            raise ValueError(f"allocation of {alloc.job_id} carries no spec: pass spec=")
        return cls(s, node_index, tuple(alloc.gpu_indices), alloc.gpu_share, expected_end)


@dataclass(frozen=True, slots=True)
class Candidate:
    node_id: str
    score: float
    terms: dict[str, float]


@dataclass(frozen=True, slots=True)
class Placement:
    node_index: int
    node_id: str
    gpu_indices: tuple[int, ...]
    gpu_share: float  # share held on each of gpu_indices (1.0 = whole GPU)
    score: float
    terms: dict[str, float]
    candidates: tuple[Candidate, ...] = ()  # top-k when explained


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a job cannot start now, in Slurm's vocabulary.

    reason: "Resources" (fits the cluster, not now), "Constraints", "GpuMemory", "GpuCount",
    "HostMemory", "Cpus", "Cordoned", "Thermal", "Reserved" (would delay a reservation),
    "Priority" (waits behind a higher-ranked job). ``never_fits``: no node could hold it even empty.
    """

    reason: str
    per_node: dict[str, str] = field(default_factory=dict)
    never_fits: bool = False


@dataclass(frozen=True, slots=True)
class Reservation:
    """The head job that cannot start holds node ``node_index`` from ``start`` (EASY backfill)."""

    job_id: str
    node_index: int
    node_id: str
    start: float


@dataclass(frozen=True, slots=True)
class RankResult:
    order: np.ndarray  # indices into the input, best first
    scores: np.ndarray  # per input job
    terms: dict[str, np.ndarray]  # per input job, each term (sprio-style)
    regime: str


@dataclass(slots=True)
class CycleResult:
    """One scheduling pass. ``assignments`` are in commit order and ALREADY applied to the view
    passed to ``schedule`` (it is updated in place)."""

    assignments: list[tuple[PendingJob, Placement]]
    reservation: Reservation | None
    waiting: dict[str, str]
    regime: str
    rank: RankResult | None = None
    # reservations of further blocked jobs below the head (PolicyConfig.reservations)
    extra_reservations: tuple[Reservation, ...] = ()
