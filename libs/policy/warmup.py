"""Load the scheduling pass's compiled loops before the first real pass.

Why: numba loads a compiled loop (from its on-disk cache, or compiles it where the cache lacks
it) on its first call with each set of argument types. A process pays that once, ~0.5 s over
the kernels of ``libs.policy.fast``, and without a warm-up it pays it inside its first
passes: in the live placer, the first decision after a restart; in the simulator, inside the
replay it times. ``warm_up`` runs the real pass (``scheduler.schedule``, ``power.plan``) on a
toy cluster and queue built to take every compiled path: the kept queue's bulk walk with
slow-GPU holds, a reservation and fractional requests, a rank epoch then a pass that scores a
new job, a pass without backfill, the plain-list pass with reasons, and a power plan that wakes
nodes. It changes nothing it is not given: the cluster, queue and jobs are its own.
``tests/policy/test_warmup.py`` checks, in a fresh process, that a replay after it loads no
further kernel.
"""

from __future__ import annotations

import numpy as np

from libs.policy import backfill as B
from libs.policy import fast as K
from libs.policy import power, scheduler
from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.inventory import demo_cluster
from libs.policy.placement import place, to_allocation
from libs.policy.profiles import ProfileTable
from libs.policy.queue import PendingQueue
from libs.policy.types import PendingJob, Placement, RunningJob
from proto.jobs import JobSpec


def warm_up(cfg: PolicyConfig | None = None, profiles: ProfileTable | None = None) -> None:
    """Run the pass's compiled paths once on a toy cluster (see the module note). A second
    call loads nothing more (~12 ms of passes); callers call it once, when they start. The
    config is passed because its numbers' types (an int where a float is usual) could ask for
    other compiled variants; the profile table's are fixed."""
    cfg = cfg or PolicyConfig.default()
    profiles = profiles or ProfileTable.default()
    nodes = demo_cluster()
    view = ClusterView.build(nodes)
    running = B.RunningSet()
    now = 100_000.0
    # fill the cluster but for a few GPUs, so the head job below is blocked and reserves
    for i, node in enumerate(nodes):
        for k in range(node.gpu_count - (1 if i % 3 == 0 else 0)):
            spec = JobSpec(id=f"run-{i}-{k}", tenant=f"t{k % 3}", gpus=1.0, gpu_mem_gb=4.0)
            p = place(spec, view, profiles, cfg)
            if isinstance(p, Placement):
                view.allocate(to_allocation(spec, p, now - 50.0))
                end = now + 600.0 * (1 + k)
                running.add(RunningJob(spec, p.node_index, p.gpu_indices, p.gpu_share, end))
    usage = {"t0": np.array([8.0, 64.0, 32.0, 8.0]), "t1": np.array([2.0, 16.0, 8.0, 2.0])}
    queue = PendingQueue()
    shapes = [
        (8.0, 40.0, 7_200.0, 9, None),  # blocked head: a whole node
        (1.0, 8.0, 7_200.0, 3, None),  # long: the slow-GPU guard holds it off T4s
        (0.5, 4.0, 600.0, 5, now + 3_600.0),  # fractional, with a deadline
        (2.0, 16.0, 14_400.0, 1, None),
        (1.0, 70.0, 3_600.0, 7, None),  # fits only on A100s
    ]
    for j in range(40):
        gpus, mem, est, prio, deadline = shapes[j % len(shapes)]
        spec = JobSpec(
            id=f"q-{j}",
            tenant=f"t{j % 3}",
            gpus=gpus,
            gpu_mem_gb=mem,
            est_runtime_s=est,
            priority=prio,
            deadline=deadline,
            energy_sensitivity=0.9 if j % 4 == 0 else 0.1,
        )
        queue.add(PendingJob(spec, enqueued_at=now - 10.0 * (40 - j)))
    kw = {"tenant_usage": usage, "profiles": profiles, "cfg": cfg}
    # a rank epoch with the bulk walk, then a job queued since (scored on its own), then a
    # pass between backfill times
    scheduler.schedule(queue, view.copy(), running, now=now, reasons=False, walked_limit=8, **kw)
    queue.add(PendingJob(JobSpec(id="q-new", tenant="t1", gpus=0.25), enqueued_at=now + 5.0))
    scheduler.schedule(
        queue, view.copy(), running, now=now + 10.0, reasons=False, walked_limit=8, **kw
    )
    scheduler.schedule(
        queue, view.copy(), running, now=now + 20.0, reasons=False, backfill=False, **kw
    )
    # a queue of one job: numpy gives its one-row columns another memory layout, which numba
    # compiles apart
    one = PendingQueue([PendingJob(queue[1].spec, enqueued_at=now - 100.0)])
    scheduler.schedule(one, view.copy(), running, now=now, reasons=False, walked_limit=8, **kw)
    # the plain-list pass with every reason (the live placer's)
    scheduler.schedule(list(queue), view.copy(), list(running), now=now, **kw)
    # power: the decision to wake nodes for blocked jobs, and which idle nodes are due
    n = len(view.node_ids)
    suspended = np.zeros(n, dtype=bool)
    suspended[-2:] = True
    ids, specs = queue.shapes()[0], queue.shapes()[2]
    demand = power.Demand.of_shapes(ids, specs, cfg.power_demand_cap)
    idle = np.full(n, 1_000.0)
    power.plan(
        view,
        idle_s=idle,
        suspended=suspended,
        resuming=np.zeros(n, dtype=bool),
        blocked=demand,
        reserved=(0,),
        cfg=cfg,
        prefer=np.arange(n)[::-1].copy(),
    )
    K.power_due(
        now, idle, suspended, np.zeros(n, dtype=bool), power.empty_nodes(view), cfg.suspend_after_s
    )
