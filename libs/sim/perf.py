"""Micro-benchmark of one scheduling pass, for the simulator's time budget.

``bench_schedule(n_nodes, queue_len, passes)`` builds a seed-mix cluster of ``n_nodes`` nodes,
fills it to about 90% with running jobs, queues ``queue_len`` mixed jobs and times ``passes``
passes of ``schedule`` on a fresh copy of the view each time (so every pass sees the same busy
cluster). Deterministic (seeded); the only clock read is the timer, and this module is never
imported by the policy itself.

``bench_replay`` is the simulator-shaped figure. Measured on the project's 2-core machine with
``.venv/bin/python -c "from libs.sim.perf import bench_replay; print(bench_replay(170, 3000,
load=1.1))"`` (6,000 events, peak queue 478):

* before the replay fast path (commit c2a6ff9): 1,120-1,290 events/s;
* after (rank epochs + queue book, cross-pass memos on the view, O(1) early exit and size
  mix): 2,380-2,500 events/s.

The full target, ``libs.sim.runner`` replaying all 81,958 Philly jobs on the 1,024-GPU seed
cluster with mosaic at ``--load 0.9``, went from 283 s to 102 s wall. The queue there holds
~21k jobs at the median pass (30k at p90: load 0.9 is relative to the fastest GPU, so the
cluster is over-subscribed), 127k passes. Not yet the 60 s target; what is left per pass is
the backfill walk (~53 rows), ``place``/``reserve`` on backfill candidates, and scoring each
arrival; the simulator adds its own per-event work (see the helper's report).
"""

from __future__ import annotations

import time

import numpy as np

from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.inventory import seed_cluster
from libs.policy.placement import first_fit, to_allocation
from libs.policy.profiles import ProfileTable
from libs.policy.scheduler import schedule
from libs.policy.types import PendingJob, Placement, RunningJob
from proto.jobs import WORKLOAD_CLASSES, JobSpec


def _job(rng: np.random.Generator, i: int, prefix: str) -> JobSpec:
    gpus = float(rng.choice([0.5, 1, 1, 1, 1, 2, 4, 8]))
    return JobSpec(
        id=f"{prefix}{i}",
        tenant=f"t{int(rng.integers(0, 8))}",
        priority=int(rng.integers(0, 10)),
        gpus=gpus,
        gpu_mem_gb=float(rng.choice([4, 8, 12, 24, 40])) * (0.5 if gpus < 1 else 1),
        host_mem_gb=float(rng.choice([8, 16, 32])),
        cpus=float(rng.choice([2, 4, 8])),
        workload_class=WORKLOAD_CLASSES[int(rng.integers(0, len(WORKLOAD_CLASSES)))],
        est_runtime_s=float(rng.uniform(600, 36000)),
        deadline=float(rng.uniform(1e4, 1e5)) if rng.random() < 0.2 else None,
        energy_sensitivity=float(rng.random()),
    )


def bench_setup(n_nodes: int, queue_len: int, seed: int = 0, fill: float = 0.9):
    rng = np.random.default_rng(seed)
    nodes = seed_cluster(int(n_nodes * 6.2))[:n_nodes]  # ~6.2 GPUs per node in the seed mix
    view = ClusterView.build(nodes)
    running: list[RunningJob] = []
    i = 0
    while view.load() < fill and i < 100_000:
        spec = _job(rng, i, "r")
        i += 1
        p = first_fit(spec, view)
        if isinstance(p, Placement):
            view.allocate(to_allocation(spec, p, 0.0))
            end = float(rng.uniform(100, 20000))
            running.append(RunningJob(spec, p.node_index, p.gpu_indices, p.gpu_share, end))
    pending = [
        PendingJob(_job(rng, k, "q"), float(rng.uniform(-5000, 0))) for k in range(queue_len)
    ]
    usage = {f"t{k}": float(rng.uniform(0, 50)) for k in range(8)}
    return view, running, pending, usage


def bench_schedule(n_nodes: int = 170, queue_len: int = 500, passes: int = 50) -> float:
    """Scheduling passes per second on a ~90%-full cluster (higher is better)."""
    view, running, pending, usage = bench_setup(n_nodes, queue_len)
    profiles = ProfileTable.default()
    cfg = PolicyConfig.default()
    copies = [view.copy() for _ in range(passes)]
    t0 = time.perf_counter()
    for v in copies:
        schedule(pending, v, running, now=0.0, tenant_usage=usage, profiles=profiles, cfg=cfg)
    dt = time.perf_counter() - t0
    return passes / dt if dt > 0 else float("inf")


def bench_replay(n_nodes: int = 170, n_jobs: int = 2000, load: float = 1.1, seed: int = 0) -> dict:
    """A toy event replay shaped like the simulator's use: Poisson arrivals at ``load`` times
    the cluster's capacity, a pass on every arrival and finish, ``PendingQueue`` kept
    incrementally, ``reasons=False``. Returns events/s, passes, placements and peak queue."""
    import heapq

    from libs.policy.backfill import RunningSet
    from libs.policy.queue import PendingQueue

    rng = np.random.default_rng(seed)
    nodes = seed_cluster(int(n_nodes * 6.2))[:n_nodes]
    view = ClusterView.build(nodes)
    profiles = ProfileTable.default()
    cfg = PolicyConfig.default()
    specs = [_job(rng, i, "j") for i in range(n_jobs)]
    mean_gpu_s = float(np.mean([s.gpus * s.est_runtime_s for s in specs]))
    rate = load * view.total_gpus() / mean_gpu_s  # arrivals per second
    t = 0.0
    events: list[tuple[float, int, str, int]] = []
    for i in range(n_jobs):
        t += float(rng.exponential(1.0 / rate))
        events.append((t, 1, "arrive", i))
    heapq.heapify(events)
    queue = PendingQueue()
    running: dict[str, object] = {}
    rset = RunningSet()
    usage: dict[str, float] = {}
    n_ev = n_pass = n_place = peak = 0
    t0 = time.perf_counter()
    c0 = time.process_time()
    while events:
        now, _, kind, i = heapq.heappop(events)
        n_ev += 1
        spec = specs[i]
        if kind == "arrive":
            queue.add(PendingJob(spec, now))
        else:
            view.release(running.pop(spec.id))
            rset.remove(spec.id)
            usage[spec.tenant] -= spec.gpus
        res = schedule(
            queue,
            view,
            rset,
            now=now,
            tenant_usage=usage,
            profiles=profiles,
            cfg=cfg,
            reasons=False,
        )
        n_pass += 1
        for pj, p in res.assignments:
            s = pj.spec
            queue.remove(s.id)
            alloc = to_allocation(s, p, now)
            end = now + profiles.runtime_s(s, view.models[view.model_idx[p.node_index]])
            running[s.id] = alloc
            rset.add(RunningJob(s, p.node_index, p.gpu_indices, p.gpu_share, end))
            usage[s.tenant] = usage.get(s.tenant, 0.0) + s.gpus
            heapq.heappush(events, (end, 0, "finish", int(s.id[1:])))
            n_place += 1
        peak = max(peak, len(queue))
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    return {
        "events_per_s": n_ev / dt,
        "events_per_cpu_s": n_ev / cpu if cpu > 0 else float("inf"),
        "seconds": dt,
        "cpu_seconds": cpu,
        "passes": n_pass,
        "placements": n_place,
        "peak_queue": peak,
    }


if __name__ == "__main__":
    for n, q in ((20, 50), (170, 100), (170, 1000), (170, 5000)):
        print(f"nodes={n} queue={q}: {bench_schedule(n, q, 30):.0f} passes/s")
    print("bench_replay(170, 3000, load=1.1):", bench_replay(170, 3000, load=1.1))
