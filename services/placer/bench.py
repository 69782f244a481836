"""``mosaic bench placer``: the live placer's decision path at cluster scale, without NATS.

What it drives is the placer's own code: lifecycle events folded by ``JobTracker``, the
scheduler kept in step by ``SchedulerFeed.sync``, ``Scheduler.tick`` deciding, and each
placement committed to an in-memory ledger and reported back with ``start_job`` (what
``services.placer.commit`` does after its KV create). Left out, and said so in the output: the
NATS round trips of the commits and announcements (one KV create and three publishes per
placement, pipelined), which ``tests/e2e`` exercises for correctness but not for speed.

Two phases, as the issue asks:
* fill: an empty cluster and a queue of ``pending`` jobs (held by the scheduler: building it,
  ``queue_build_s``, is reported apart, as a live placer pays it job by job as they arrive);
  cycles until a cycle places nothing. ``placements_per_s`` = placements / wall seconds of
  those cycles.
* steady state: the queue held at ``pending``: every cycle some running jobs end and as many new
  jobs arrive; ``cycle_p50_s``/``cycle_p99_s`` over those cycles.

The cluster is the brief's mix (40% 8xA100 80 GB, 30% 4xV100 32 GB, 30% 8xT4 16 GB, by node
count) scaled to about ``gpus`` GPUs; jobs are a seeded mix of shapes (fractions to 8-GPU gangs),
priorities and a few deadlines.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from libs.policy.config import PolicyConfig
from libs.policy.inventory import NodeGroup, expand
from libs.policy.profiles import ProfileTable
from libs.policy.warmup import warm_up
from proto.events import Completed, Submitted
from proto.jobs import JobSpec
from proto.ledger import Allocation
from proto.nodes import NodeSpec
from services.placer.feed import SchedulerFeed
from services.placer.tracker import JobTracker

# (GPUs, GPU memory GB, share of jobs): mostly small, some gangs, some fractions
SHAPES = ((0.5, 8.0, 0.10), (1, 16.0, 0.40), (2, 16.0, 0.20), (4, 24.0, 0.18), (8, 32.0, 0.12))
CLASSES = ("cnn", "rnn", "transformer", "recommendation", "other")


def cluster(gpus: int) -> list[NodeSpec]:
    """About ``gpus`` GPUs in the brief's node mix (by node count)."""
    per_node = 0.4 * 8 + 0.3 * 4 + 0.3 * 8
    n = max(3, round(gpus / per_node))
    a, v = round(0.4 * n), round(0.3 * n)
    groups = [
        NodeGroup(count=a, gpu_model="a100-80gb", gpu_count=8, host_mem_gb=1024, cpus=128),
        NodeGroup(count=v, gpu_model="v100-32gb", gpu_count=4, host_mem_gb=512, cpus=64),
        NodeGroup(count=n - a - v, gpu_model="t4", gpu_count=8, host_mem_gb=512, cpus=64),
    ]
    return expand(groups)


def job(rng: random.Random, i: int, now: float) -> JobSpec:
    r, acc = rng.random(), 0.0
    gpus, mem = SHAPES[-1][0], SHAPES[-1][1]
    for g, m, p in SHAPES:
        acc += p
        if r < acc:
            gpus, mem = g, m
            break
    runtime = rng.choice((600.0, 1800.0, 3600.0, 4 * 3600.0))
    deadline = now + 3 * runtime if rng.random() < 0.05 else None
    return JobSpec(
        id=f"b-{i}",
        tenant=f"t{rng.randrange(8)}",
        priority=rng.choice((1, 3, 5, 5, 5, 7, 9)),
        gpus=gpus,
        gpu_mem_gb=mem,
        host_mem_gb=8.0 * max(1.0, gpus),
        cpus=2 * max(1, int(gpus)),
        est_runtime_s=runtime,
        workload_class=rng.choice(CLASSES),
        deadline=deadline,
        submit_time=now,
    )


@dataclass
class Driver:
    """The placer's decision path over an in-memory ledger (see the module docstring)."""

    nodes: dict[str, NodeSpec]
    feed: SchedulerFeed
    tracker: JobTracker
    ledger: dict[str, Allocation]

    def submit(self, specs: Sequence[JobSpec], now: float) -> None:
        for s in specs:
            self.tracker.apply(Submitted(job_id=s.id, time=now, spec=s))

    def end(self, jobs: Sequence[str], now: float) -> None:
        for j in jobs:
            alloc = self.ledger.pop(j)
            self.tracker.apply(Completed(job_id=j, time=now, node=alloc.node))
            self.feed.touch(j)

    def sync(self, now: float):
        sched, _ = self.feed.sync(
            nodes=self.nodes,
            tracker=self.tracker,
            ledger=self.ledger,
            gone=frozenset(),
            holds={"down": set()},
            temps={},
            now=now,
            settled=True,
        )
        assert sched is not None
        return sched

    def cycle(self, now: float) -> int:
        sched = self.sync(now)
        decisions = sched.tick(now)
        for p in decisions.places:
            a = p.allocation
            self.ledger[a.job_id] = a
            self.tracker.note_placed(a.job_id, a.attempt)
            sched.start_job(a.job_id, a, p.job.spec, now)
        sched.reason_changes(500)  # what the placer tells per cycle
        return len(decisions.places)


def run(gpus: int, pending: int, *, seed: int = 1, steady_cycles: int = 60) -> dict:
    cfg = PolicyConfig.default()  # the live placer's policy (power saving on)
    profiles = ProfileTable.default()
    warm_up(cfg, profiles)
    nodes = cluster(gpus)
    d = Driver({n.id: n for n in nodes}, SchedulerFeed(cfg, profiles), JobTracker(), {})
    rng = random.Random(seed)
    now = 1.7e9
    d.submit([job(rng, i, now) for i in range(pending)], now)
    # the queue as the live placer holds it once the jobs have arrived (each job's share of
    # this is paid when it arrives, not by the fill)
    t0 = time.perf_counter()
    d.sync(now)
    queue_build_s = time.perf_counter() - t0
    next_id = pending
    placements, fill_s, fill_cycles = 0, 0.0, 0
    while True:
        t0 = time.perf_counter()
        n = d.cycle(now)
        fill_s += time.perf_counter() - t0
        fill_cycles += 1
        placements += n
        now += cfg.backfill_interval_s  # every fill cycle a backfill pass: it walks the queue
        if n == 0:
            break
    fill_s_first = fill_s
    # steady state: jobs end and as many arrive (the queue stays at `pending`)
    times: list[float] = []
    churn = max(1, len(d.ledger) // 200)
    for _ in range(steady_cycles):
        now += 2.0
        done = rng.sample(sorted(d.ledger), min(churn, len(d.ledger)))
        d.end(done, now)
        d.submit([job(rng, next_id + k, now) for k in range(len(done))], now)
        next_id += len(done)
        t0 = time.perf_counter()
        d.cycle(now)
        times.append(time.perf_counter() - t0)
    sched = d.feed.sched
    assert sched is not None
    return {
        "nodes": len(nodes),
        "gpus": int(sum(n.gpu_count for n in nodes)),
        "pending": pending,
        "placements": placements,
        "queue_build_s": round(queue_build_s, 3),
        "fill_cycles": fill_cycles,
        "fill_s": round(fill_s_first, 3),
        "placements_per_s": round(placements / fill_s_first, 1) if fill_s_first else None,
        "steady_cycles": steady_cycles,
        "steady_churn_per_cycle": churn,
        "cycle_p50_s": round(float(np.percentile(times, 50)), 4),
        "cycle_p99_s": round(float(np.percentile(times, 99)), 4),
        "queued_after": len(sched.queue),
        "measures": "the placer's decision path (feed.sync + Scheduler.tick + in-memory commit);"
        " NATS commits and announcements not included",
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mosaic bench placer", description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=1000)
    ap.add_argument("--pending", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steady-cycles", type=int, default=60)
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    a = ap.parse_args(argv)
    out = run(a.gpus, a.pending, seed=a.seed, steady_cycles=a.steady_cycles)
    if a.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:>24}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
