"""The high-priority hold (libs.policy.stages.hold): the definition, its invariant, and the
scheduler keeping the warm reserve's head-room for an urgent job (both drivers run it
through ``core.Scheduler``)."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.policy.config import PolicyConfig
from libs.policy.core import Scheduler
from libs.policy.stages.hold import HIGH_HOLD, held_nodes, hold_gpus
from libs.policy.types import PendingJob
from proto.jobs import JobSpec
from tests.policy.test_warm import _idle_scheduler as idle_scheduler


def test_hold_is_kept_on_models_with_urgent_starts_and_a_node_asleep():
    h = hold_gpus(16.0, np.array([True, True, False]), np.array([True, False, True]))
    assert h.tolist() == [16, 0, 0]
    assert hold_gpus(16.0, np.array([True]), np.array([False])) is None
    assert hold_gpus(0.0, np.array([True]), np.array([True])) is None


def test_a_start_that_would_eat_the_hold_is_refused_on_every_node_of_the_model():
    free = np.array([8, 3, 8, 8])
    cordoned = np.array([False, False, True, False])  # node 2 is asleep: not counted
    model = np.array([0, 0, 0, 1])
    hold = np.array([4, 0])
    assert held_nodes(free, cordoned, model, hold, 7) is None  # 11 - 7 leaves 4
    held = held_nodes(free, cordoned, model, hold, 8)
    assert held.tolist() == [True, True, False, False]  # model 1 holds nothing
    assert held_nodes(free, cordoned, model, np.array([0, 0]), 8) is None


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_an_allowed_start_never_leaves_less_than_the_hold_free(data):
    """Any start the hold allows on a model leaves at least its hold whole and free there:
    the GPUs an urgent job needs stay awake and free."""
    n = data.draw(st.integers(1, 8))
    width = data.draw(st.lists(st.sampled_from([4, 8]), min_size=n, max_size=n))
    free = np.array([data.draw(st.integers(0, w)) for w in width])
    model = np.array(data.draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)))
    cordoned = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    hold = np.array(data.draw(st.lists(st.integers(0, 12), min_size=2, max_size=2)))
    gpus = data.draw(st.integers(1, 8))
    held = held_nodes(free, cordoned, model, hold, gpus)
    for i in range(n):
        if free[i] < gpus or cordoned[i] or (held is not None and held[i]):
            continue
        after = free.copy()
        after[i] -= gpus
        m = model[i]
        assert after[(model == m) & ~cordoned].sum() >= hold[m]


def _idle_scheduler(cfg: PolicyConfig) -> tuple[Scheduler, float]:
    """Five A100 nodes that ran an ordinary and a high-priority whole-node job and then
    idled for an hour: the 16-GPU burst and the 8-GPU head-room keep three awake, and the
    hold (if any) its GPUs more."""
    return idle_scheduler(cfg, n_a100=5, n_t4=0, priorities=(5, 9))


def test_scheduler_keeps_the_hold_for_the_urgent_job():
    """With an 8-GPU hold four A100 nodes are awake, one asleep: an ordinary burst of four
    whole-node jobs takes three and is held off the last, which then starts the urgent job
    at once. Without the hold three are awake, the burst takes them all and the urgent job
    waits a boot (the test can fail)."""
    cfg = PolicyConfig.default()
    seen = {}
    for hold in (0.0, 8.0):
        s, now = _idle_scheduler(dataclasses.replace(cfg, warm_high_hold_gpus=hold))
        awake = [s.power_state(n) for n in s.view.node_ids].count("awake")
        assert awake == (4 if hold else 3)
        if hold:
            assert "+8 GPUs held for high priority" in s.power_reason("a0", now)
        for i in range(4):
            s.queue_job(PendingJob(JobSpec(id=f"lo{i}", gpus=8.0, gpu_mem_gb=40.0), now))
        d = s.tick(now)
        for p in d.places:
            s.start_job(p.job.spec.id, p.allocation, p.job.spec, now)
        assert d.wake  # the jobs left waiting wake nodes for themselves
        placed = {p.job.spec.id for p in d.places}
        reason = s.last.waiting.get("lo3")  # the pass's own reason (reason_of: NodeWaking)
        urgent = JobSpec(id="hi", gpus=8.0, gpu_mem_gb=40.0, priority=9)
        s.queue_job(PendingJob(urgent, now + 1))
        d2 = s.tick(now + 1)
        seen[hold] = (placed, {p.job.spec.id for p in d2.places}, reason)
    assert seen[0.0][:2] == ({"lo0", "lo1", "lo2"}, set())
    assert seen[8.0][:2] == ({"lo0", "lo1", "lo2"}, {"hi"})
    assert seen[8.0][2] == HIGH_HOLD
