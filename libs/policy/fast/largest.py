"""The largest free block during a pass, kept incrementally (the fast path of
``fast.largest_free``, which scans every node: ``view.whole_free.max()``, ``view.gpu_free.max()``).

Why: a pass re-read the largest free block after every placement (a job larger than it is
refused at once), an O(nodes) scan; at 80,000 GPUs that scan was a quarter of a fill.
"""

from __future__ import annotations

import numpy as np

from libs.policy.cluster import ClusterView
from libs.policy.fast.fit import largest_free

# below this many nodes the compiled scan of every node (~1 us per 100 nodes) costs less than
# the counting's numpy calls (a few us each); above it the scan dominates a big fill
SCAN_BELOW_NODES = 2048


class LargestFree:
    """The largest free block of a view during a pass (``fast.largest_free``: the most whole
    free GPUs on one node, the largest free share of one GPU), kept after each placement
    without the O(nodes) scan while another node still holds the old maximum: a placement only
    shrinks its own node. The nodes at each maximum are counted when first needed; only when
    a count falls to zero is the view scanned again."""

    def __init__(self, view: ClusterView, now_max: tuple[int, float]) -> None:
        self.view = view
        self.max_whole, self.max_share = now_max
        self._at_max: tuple[int, int] | None = None

    def after_placement(self, i: int, whole_before: int, share_before: float) -> tuple[int, float]:
        """(max whole, max share) after a placement on node ``i``, which had ``whole_before``
        whole free GPUs and ``share_before`` as its largest free share before it."""
        view = self.view
        if len(view.node_ids) < SCAN_BELOW_NODES:  # a compiled scan is cheaper than counting
            self.max_whole, self.max_share = largest_free(view.whole_free, view.gpu_free)
            return self.max_whole, self.max_share
        if self._at_max is None:  # counted after the placement: node i is where it is now
            self._at_max = (
                int(np.count_nonzero(view.whole_free == self.max_whole)),
                int(np.count_nonzero(view.gpu_free.max(axis=1) == self.max_share)),
            )
            whole_before, share_before = int(view.whole_free[i]), float(view.gpu_free[i].max())
        n_w, n_s = self._at_max
        if whole_before == self.max_whole and int(view.whole_free[i]) < self.max_whole:
            n_w -= 1
        if share_before == self.max_share and float(view.gpu_free[i].max()) < self.max_share:
            n_s -= 1
        if n_w > 0 and n_s > 0:
            self._at_max = (n_w, n_s)
        else:
            self.max_whole, self.max_share = largest_free(view.whole_free, view.gpu_free)
            self._at_max = None
        return self.max_whole, self.max_share
