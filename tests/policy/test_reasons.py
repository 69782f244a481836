"""``reasons.WaitReasons``: change tracking that starts with the first ``changes`` call hands out
what tracking from the start would, and what a full recomputation says changed."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.policy.cluster import ClusterView
from libs.policy.inventory import demo_cluster
from libs.policy.queue import PendingQueue
from libs.policy.reasons import WaitReasons
from libs.policy.types import CycleResult, PendingJob
from proto.jobs import JobSpec

NODES = demo_cluster()
JOBS = [f"j{i}" for i in range(8)]
WHY = ["Resources", "SlowGPU", "Reserved", "Priority"]

op = st.one_of(
    st.tuples(st.just("queue"), st.sampled_from(JOBS)),
    st.tuples(st.just("leave"), st.sampled_from(JOBS)),
    st.tuples(
        st.just("pass"),
        st.booleans(),  # a backfill pass
        st.dictionaries(st.sampled_from(JOBS), st.sampled_from(WHY), max_size=6),
        st.lists(st.sampled_from(JOBS), max_size=2),  # placed (they leave right after)
    ),
    st.tuples(st.just("boot"), st.booleans()),
    st.tuples(st.just("ask"), st.integers(0, 10)),
)


class Side:
    """One scheduler's queue and reasons, fed the same events as the other side."""

    def __init__(self, track_from_start: bool) -> None:
        self.queue = PendingQueue()
        self.booting = np.zeros(len(NODES), dtype=bool)
        view = ClusterView.build(NODES)
        self.why = WaitReasons(self.queue, view, lambda: self.booting)
        if track_from_start:
            assert self.why.changes(0) == {}  # tracking on from here, nothing handed out
        self.handed: dict[str, str] = {}  # what a publisher holds after every ask

    def apply(self, o: tuple) -> dict[str, str] | None:
        kind = o[0]
        if kind == "queue" and o[1] not in self.queue:
            self.queue.add(PendingJob(JobSpec(id=o[1]), 0.0))
            self.why.queued(o[1])
        elif kind == "leave" and o[1] in self.queue:
            self.queue.remove(o[1])
            self.why.forget(o[1])
        elif kind == "pass":
            _, full, waiting, placed = o
            waiting = {j: r for j, r in waiting.items() if j in self.queue}
            placed = [j for j in dict.fromkeys(placed) if j in self.queue and j not in waiting]
            assignments = [(self.queue.get(j), None) for j in placed]
            self.why.note(CycleResult(assignments, None, waiting, "normal"), full)
            for j in placed:
                self.queue.remove(j)
                self.why.forget(j)
        elif kind == "boot":  # all of the booting nodes or none: NodeWaking applies or not
            self.booting[:] = o[1]
        elif kind == "ask":
            out = self.why.changes(10_000)
            self.handed.update(out)
            for j in list(self.handed):
                if j not in self.queue:
                    del self.handed[j]
            return out
        return None


@settings(max_examples=200, deadline=None)
@given(st.lists(op, max_size=40))
def test_lazy_change_tracking_hands_out_what_tracking_from_the_start_does(ops):
    lazy, eager = Side(False), Side(True)
    boot_since_pass = False  # NodeWaking is looked at again by the next pass (as ever)
    for o in ops:
        boot_since_pass = (o[0] == "boot" or boot_since_pass) and o[0] != "pass"
        a, b = lazy.apply(o), eager.apply(o)
        assert a == b
        if o[0] == "ask" and not boot_since_pass:  # both hold what a recomputation says
            assert lazy.handed == {j.spec.id: lazy.why.of(j.spec.id) for j in lazy.queue}
    assert lazy.why.all() == eager.why.all()
