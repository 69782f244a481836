"""What ``core.Scheduler`` decides, as plain records both drivers apply the same way.

Not wire types: the simulator applies them to its ledger, the live placer turns them into
ledger entries and node commands (``proto``) at its edge.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from libs.policy.types import PendingJob, Placement
from proto.ledger import Allocation

# Why a job waits, in Slurm's vocabulary (``squeue`` REASON), plus Mosaic's own:
PRIORITY = "Priority"  # a higher-ranked job waits first; this one was not reached
RESOURCES = "Resources"  # it fits the cluster, not now
NODE_WAKING = "NodeWaking"  # a node that could hold it is booting
CORDONED = "Cordoned"  # only cordoned (or down, or asleep) nodes could hold it
RESERVED = "Reserved"  # starting it would delay a reservation held for a blocked job
WAIT_REASONS = (PRIORITY, RESOURCES, NODE_WAKING, CORDONED, RESERVED)


@dataclass(frozen=True, slots=True)
class Place:
    """Start ``job`` with ``allocation`` (already applied to the scheduler's view)."""

    job: PendingJob
    placement: Placement
    allocation: Allocation


@dataclass(frozen=True, slots=True)
class MoveOrder:
    """Checkpoint ``job_id``'s attempt ``attempt`` on ``node`` and requeue it with its progress
    and a resume deadline (``stages.preempt``). ``kind``: ``preempt`` (room for ``for_job``)
    or ``migrate`` (leave the node), a shrink when ``shrink_to`` is set; ``intent``: the
    ``proto.intents`` id it answers, "" when the scheduler decided it itself (the
    priority-protection rule)."""

    job_id: str
    attempt: int
    node: str
    kind: str
    reason: str
    for_job: str = ""
    intent: str = ""
    source: str = "scheduler"
    to_node: str = ""  # where the moved job resumes (held for it while it saves), "" unknown
    shrink_to: int = 0  # elastic: it resumes on this many GPUs (``stages.shrink``); 0: same size


@dataclass(frozen=True, slots=True)
class Decisions:
    """One tick: jobs to start (in commit order), jobs to move, nodes to suspend and wake, when the
    scheduler wants a tick again without an event (None: only on an event)."""

    places: list[Place] = field(default_factory=list)
    suspend: tuple[str, ...] = ()
    wake: tuple[str, ...] = ()
    next_tick_s: float | None = None
    warm: tuple[str, ...] = ()  # of ``wake``: woken to refill the warm reserve (libs.policy.warm)
    moves: tuple[MoveOrder, ...] = ()  # running jobs to checkpoint and requeue
    passed: bool = False  # whether a scheduling pass ran (else only the power stage)
    regime: str = ""
