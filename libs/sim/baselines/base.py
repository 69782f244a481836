"""What every baseline shares: no-op hooks and one non-blocking first-fit scan.

The scan is where the baselines spend their time, so it is built to stay cheap on queues of
thousands: it stops as soon as no GPU is free, and it remembers request shapes that did not fit
in this pass (resources only shrink during a pass, so a shape that failed once fails again).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from libs.sim.cluster import EPS, SimCluster
from libs.sim.state import Assignment, SimContext, SimJob


class BasePolicy:
    """Default hooks; subclasses implement ``schedule``."""

    name = "base"
    checks_memory = True  # whether placements respect GPU memory (lets the engine skip passes)

    def attach(self, ctx: SimContext) -> None:
        self.ctx = ctx

    def can_ever_place(self, job: SimJob) -> bool:
        """Whether this policy could place ``job`` on the empty cluster (the engine's own
        check already passed). Baselines gang across nodes, so they can."""
        return True

    def enqueued(self, job: SimJob, now: float) -> None:
        pass

    def started(self, job: SimJob, now: float) -> None:
        pass

    def ended(self, job: SimJob, now: float) -> None:
        pass

    def schedule(
        self, queue: Collection[SimJob], view: SimCluster, running: Collection[SimJob], now: float
    ) -> list[Assignment]:
        raise NotImplementedError


def shape(job: SimJob, check_memory: bool) -> tuple:
    s = job.spec
    return (s.gpus, s.gpu_mem_gb if check_memory else 0.0, s.host_mem_gb, s.cpus, s.constraints)


def first_fit_scan(
    ordered: Iterable[SimJob],
    cluster: SimCluster,
    *,
    check_memory: bool,
    blocking: bool,
) -> list[Assignment]:
    """Place jobs in the given order, each on the first node that holds it.

    ``blocking=True`` is strict head-of-line order: the first job that does not fit stops the
    pass (FIFO). Otherwise later jobs may start around it. Each placement is applied to the
    ledger tentatively (so the next job sees what is left) and rolled back before returning:
    the engine commits what the policy chose, and checks it.
    """
    out: list[Assignment] = []
    failed: set[tuple] = set()
    for job in ordered:
        if cluster.allocated_gpus >= cluster.capacity_gpus - EPS:
            break
        s = job.spec
        if s.gpus <= cluster.widest(s.constraints) and not cluster.might_fit(
            s.gpus, s.gpu_mem_gb if check_memory else 0
        ):
            if blocking:
                break
            continue
        key = shape(job, check_memory)
        if key in failed:
            if blocking:
                break
            continue
        allocs = cluster.first_fit(job.spec, check_memory=check_memory)
        if allocs is None:
            failed.add(key)
            if blocking:
                break
            continue
        for a in allocs:
            cluster.allocate(a, notify=False)
        out.append((job, allocs))
    for _, allocs in out:
        for a in allocs:
            cluster.release(a, notify=False)
    return out


def movable(job: SimJob) -> bool:
    """Whether a job may be preempted: the engine's own rule (``libs.sim.moves``), the same
    for every policy. A baseline never orders a move the engine would refuse."""
    return bool(job.spec.checkpointable or job.spec.elastic is not None)


def checkpointing(job: SimJob) -> bool:
    """A move of this job is under way (it holds its GPUs until the checkpoint is saved)."""
    return job.ckpt_start_s >= 0


NO_PREEMPTION_SUFFIX = "-np"  # ``tiresias-np``: the same policy with preemption switched off
