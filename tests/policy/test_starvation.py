"""Starvation bound and the slow-GPU guard.

Aging adds ``aging_per_h`` per hour waited and a fresh job scores at most 1 + w_short (the
shortness term is at most w_short), so a job of the lowest priority outranks every fresh job once
it has waited (1 + w_short) / aging_per_h hours, whatever the other terms say. The slow-GPU
guard makes a long job wait for a fast GPU at most as long as it would lose on the slow one.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.placement import Placement
from libs.policy.priority import rank
from libs.policy.profiles import ProfileTable
from libs.policy.scheduler import schedule
from libs.policy.types import PendingJob
from proto.jobs import JobSpec
from tests.policy.strategies import node_spec

P = ProfileTable.default()
CFG = PolicyConfig.default()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 9),
            st.floats(0.0, 1.0),
            st.sampled_from([None, 600.0, 7200.0]),
            st.integers(0, 3),
        ),
        min_size=1,
        max_size=8,
    ),
    st.floats(0.0, 1.0),
    st.sampled_from([0.1, 0.5, 0.9]),
)
def test_a_lowest_priority_job_outranks_fresh_jobs_after_the_bound(fresh, es, load):
    now = 1e6
    bound_s = 3600.0 * (1.0 + CFG.w_short) / CFG.aging_per_h
    old = PendingJob(
        JobSpec(id="old", priority=0, energy_sensitivity=es, tenant="hog"), now - bound_s - 1
    )
    jobs = [old]
    for k, (prio, e, slack, tenant) in enumerate(fresh):
        dl = None if slack is None else now + slack
        spec = JobSpec(
            id=f"f{k}", priority=prio, energy_sensitivity=e, deadline=dl, tenant=f"t{tenant}"
        )
        jobs.append(PendingJob(spec, now))
    usage = {"hog": 1000.0}  # the old job's tenant holds a big share: fair share is against it
    r = rank(jobs, now=now, load=load, tenant_usage=usage, capacity=64.0, cfg=CFG, profiles=P)
    assert int(r.order[0]) == 0


def test_a_long_job_waits_for_a_fast_gpu_at_most_its_loss():
    # only the T4 node is free (the A100 node is cordoned: e.g. suspended)
    v = ClusterView.build(
        [node_spec("t4", 8, "t4", 16), node_spec("a100", 8, "a100-80gb", 80)], cordoned=["a100"]
    )
    spec = JobSpec(id="long", gpus=8, gpu_mem_gb=8, workload_class="cnn", est_runtime_s=86400)
    slow, fast = P.runtime_s(spec, "t4"), P.runtime_s(spec, "a100-80gb")
    assert P.speed("t4", "cnn") < CFG.slow_guard_min_speed * P.speed("a100-80gb", "cnn")
    loss = slow - fast

    def run(waited: float):
        return schedule(
            [PendingJob(spec, 0.0)],
            v.copy(),
            [],
            now=waited,
            tenant_usage={},
            profiles=P,
            cfg=CFG,
        )

    early = run(0.5 * loss)
    assert early.assignments == [] and early.waiting["long"] == "SlowGPU"
    late = run(loss + 1.0)
    assert len(late.assignments) == 1
    _, p = late.assignments[0]
    assert isinstance(p, Placement) and p.node_id == "t4"
    # a short job is never held back
    short = JobSpec(id="s", gpus=8, gpu_mem_gb=8, workload_class="cnn", est_runtime_s=600)
    r = schedule(
        [PendingJob(short, 0.0)], v.copy(), [], now=0.0, tenant_usage={}, profiles=P, cfg=CFG
    )
    assert len(r.assignments) == 1
    assert np.isfinite(loss)
