"""``step.LargestFree`` keeps what ``fast.largest_free`` would say after every placement."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from libs.policy import fast as K
from libs.policy.cluster import ClusterView
from libs.policy.fast import largest
from libs.policy.fast.largest import LargestFree
from libs.policy.inventory import demo_cluster
from proto.ledger import Allocation


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.sampled_from([0.25, 0.5, 1.0])), max_size=60))
def test_after_every_placement_it_equals_a_full_scan(placements):
    saved, largest.SCAN_BELOW_NODES = largest.SCAN_BELOW_NODES, 0  # the counting path, always
    try:
        _place_and_compare(placements)
    finally:
        largest.SCAN_BELOW_NODES = saved


def _place_and_compare(placements) -> None:
    view = ClusterView.build(demo_cluster())
    tracker = LargestFree(view, K.largest_free(view.whole_free, view.gpu_free))
    for n, (node, share) in enumerate(placements):
        free = [g for g in range(int(view.gpu_total[node])) if view.gpu_free[node, g] >= share]
        if not free:
            continue
        before = (int(view.whole_free[node]), float(view.gpu_free[node].max()))
        view.allocate(
            Allocation(
                job_id=f"j{n}",
                node=view.node_ids[node],
                gpu_indices=(free[0],),
                gpu_share=share,
                gpu_mem_gb=1.0,
                host_mem_gb=1.0,
                cpus=1.0,
                time=0.0,
            )
        )
        got = tracker.after_placement(node, *before)
        # the definition: the most whole free GPUs on a node, the largest free share of a GPU
        assert got == (int(view.whole_free.max()), float(view.gpu_free.max()))
        assert got == K.largest_free(view.whole_free, view.gpu_free)
