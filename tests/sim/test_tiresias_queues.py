"""The queues Tiresias keeps per event (libs.sim.baselines.tiresias_queues) give the order and
the instants its definitions give when evaluated from scratch: ``sorted(queue, key)`` and the
scan of every waiting job for the next STARVELIMIT."""

from __future__ import annotations

import math
import random

import numpy as np

from libs.sim.baselines.tiresias import Tiresias
from libs.sim.state import SimContext, SimJob
from tests.sim.helpers import job


def _job(i: int, rng: random.Random) -> SimJob:
    j = SimJob(i, job(f"j{i}", 0, 1_000, gpus=1).spec, rng.uniform(0, 5_000), np.ones(1), 1.0)
    j.run_s = rng.choice([0.0, rng.uniform(1, 3_000)])
    j.attained_gpu_s = j.run_s * rng.choice([0.5, 1.0, 3.0])
    return j


def test_the_kept_order_and_promotions_match_the_definitions() -> None:
    rng = random.Random(5)
    p = Tiresias()
    p.attach(SimContext(None, [], None, []))
    jobs = [_job(i, rng) for i in range(300)]
    waiting: dict[int, SimJob] = {}
    now = 0.0
    promoted = 0
    for step in range(600):
        now += rng.uniform(0, 400)
        j = rng.choice(jobs)
        if j.idx in waiting and rng.random() < 0.4:  # it starts (and leaves the queue)
            del waiting[j.idx]
            j.state = "running"
            j.start_s = now
            p.started(j, now)
            p.ended(j, now)  # ends at once: it ran no longer
            j.state = "backoff"
        elif j.idx not in waiting:
            j.state, j.enqueue_s = "pending", now
            waiting[j.idx] = j
            p.enqueued(j, now)
        # the instant handed to the engine is the scan's: the earliest limit still ahead
        ahead = [
            w.enqueue_s + p.starve_factor * w.run_s
            for w in waiting.values()
            if w.run_s > 0 and w.enqueue_s + p.starve_factor * w.run_s > now
        ]
        assert p.queues.next_promotion_s(now) == (min(ahead) if ahead else math.inf)
        if step % 3 == 0:  # a pass: promotions, then the kept order is the sorted one
            promoted += sum(1 for w in waiting.values() if p.queues.queue_of[w.idx])
            p._promote(now)
            promoted -= sum(1 for w in waiting.values() if p.queues.queue_of[w.idx])
            want = sorted(waiting.values(), key=lambda w: p.key(w, now))
            assert [w.idx for w in p.queues.in_order()] == [w.idx for w in want]
    assert promoted > 10  # the test saw jobs move up, not only arrivals
