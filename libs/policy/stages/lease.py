"""Swap leases: the short-wait swap keeps its resume promise when the short job overruns.

Why: the short-wait rule's swap (``stages.short_wait``, on a full cluster) stops a long job so a
short one runs on its node, and promises the long job it resumes there "after it", within the
resume bound (``PreemptConfig.resume_bound_s``). That promise rests on one number, the short
job's runtime estimate. With estimates made noisy (x lognormal, sigma 0.5) on full Philly, 17
of 891 swaps broke the bound, by up to 7 h: a job estimated at 10 min that ran for hours kept
its victim waiting all that time (every other rule's victims kept it).

The rule: a swap leases the node to the short job until the victims' resume deadline less one
save and one look (``lease_until_s``). If at that instant the short job still runs there and
a victim still waits, the short job is checkpointed and requeued with its progress
(``lease_move``), as Slurm ends a job at its time limit, only here it resumes later instead of
being killed; the node then goes back to the victims (their rooms, ``core_moves``). So the
swap needs a short job that can be checkpointed or shrunk (``stages.preempt.ever_movable``):
one that cannot would hold the promise hostage to its estimate, and no such swap is made.

The stopped short job waits first in line with its own resume deadline, like any moved job,
but no room is promised to it: its estimate was wrong, not the plan. Its delay is counted with
every resume delay (``libs.sim.metrics``). Pure: both drivers apply the move as every move.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from libs.policy.config import PreemptConfig
from libs.policy.decisions import MoveOrder

LEASE_RULE = "swap-lease"


@dataclass(frozen=True, slots=True)
class Lease:
    """``job_id`` (the short job) may run on ``node`` until ``until_s``, while ``victims``
    (the jobs the swap stopped) wait to resume there."""

    job_id: str
    node: str
    until_s: float
    victims: tuple[str, ...]


def lease_until_s(now: float, pc: PreemptConfig) -> float:
    """When a swap decided ``now`` ends its lease: the victims' rooms last ``resume_bound_s``
    from now (``moves.MoveBook.order``), and the short job's save must end by then, with one
    look's interval (``interval_s``) to spare: a driver acts at the first instant it looks
    after the end (the live placer cycles every ``tick_s``, 2 s), and a save may run long."""
    return now + pc.resume_bound_s - pc.checkpoint_cost_s - pc.interval_s


def due(leases: Iterable[Lease], now: float) -> list[Lease]:
    """The leases whose end has come, in end order (then by job id: the same in both drivers)."""
    ended = [le for le in leases if le.until_s <= now]
    return sorted(ended, key=lambda le: (le.until_s, le.job_id))


def next_end_s(leases: Iterable[Lease], now: float) -> float | None:
    """The next lease end after ``now`` (a wake-up: on a full cluster nothing else may come)."""
    later = [le.until_s for le in leases if le.until_s > now]
    return min(later) if later else None


def lease_move(
    lease: Lease,
    running_on: Callable[[str], tuple[int, str] | None],
    waiting: Callable[[str], bool],
) -> MoveOrder | None:
    """The move a lease's end calls for, or None (the lease is simply over): the short job,
    when it still runs on the lease's node (``running_on``: its (attempt, node), None when it
    does not run or is being moved) while a victim still waits (``waiting``)."""
    left = [v for v in lease.victims if waiting(v)]
    at = running_on(lease.job_id)
    if not left or at is None or at[1] != lease.node:
        return None
    reason = (
        f"{LEASE_RULE}: {lease.job_id} still runs on {lease.node} at the end of its lease "
        f"(it overran its estimate); stopped so {', '.join(left)} resume there within the bound"
    )
    return MoveOrder(lease.job_id, at[0], lease.node, "preempt", reason, for_job=left[0])
