"""``fast.protected.ProtectedWaits`` answers the priority-protection rule's per-instant questions
as the definitions' scans of the queue do (``MovesMixin._waited_rows``, ``_next_ready_s``)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from libs.policy.config import PolicyConfig
from libs.policy.core import Scheduler
from libs.policy.inventory import demo_cluster
from libs.policy.profiles import ProfileTable
from libs.policy.types import PendingJob
from proto.jobs import JobSpec

NODES = demo_cluster()
ENQ = st.sampled_from([0.0, 0.1, 0.3, 599.9, 600.0, 1234.5, 1e9 + 0.1, -604800.0])
op = st.one_of(
    st.tuples(st.just("queue"), st.integers(0, 9), st.integers(0, 10), ENQ),
    st.tuples(st.just("cancel"), st.integers(0, 9)),
)
NOW = st.sampled_from([0.0, 599.9, 600.0, 600.1, 700.3, 1834.5, 1e9 + 600.1, 1e10])


@settings(max_examples=200, deadline=None)
@given(st.lists(op, max_size=30), st.lists(NOW, min_size=1, max_size=4))
def test_the_kept_protected_waits_answer_as_the_queue_scans(ops, nows):
    s = Scheduler(NODES, cfg=PolicyConfig.default(), profiles=ProfileTable.default())
    for o in ops:
        if o[0] == "queue":
            _, j, prio, enq = o
            s.queue_job(PendingJob(JobSpec(id=f"j{j}", priority=prio), enq))
        else:
            s.cancel_job(f"j{o[1]}", 0.0)
    for now in nows:
        rows = s._waited_rows(now).tolist()
        waited = s.protected.waited_since(now - s.cfg.preempt.min_wait_s)
        assert sorted(waited) == sorted(s.queue[r].spec.id for r in rows)
        enq = [s.queue.get(j).enqueued_at for j in waited]
        assert enq == sorted(enq)
        assert s.protected.next_ready_s(now, s.cfg.preempt.min_wait_s) == s._next_ready_s(now)
    assert len(s.protected) == len(s._protected_rows())
