"""The simulator engine's cheap test before a pass: could any queued request fit now?

Why it is its own definition: the engine skips a pass when nothing could fit, and which
instants run a pass decides what the scheduler decides (a pass consumes the backfill cadence
and starts rank epochs), so the live placer must skip the same passes: both drivers ask
``core.Scheduler.could_place_now``, which is this test on the scheduler's view.
"""

from __future__ import annotations

from collections.abc import Iterable

from libs.policy.cluster import EPS, ClusterView


def could_place(asks: Iterable[tuple[float, float]], view: ClusterView) -> bool:
    """Could any request of ``asks`` ((GPUs, GPU memory per GPU in GB), one per distinct
    shape queued) fit somewhere on ``view`` now: a necessary condition, never wrong in the
    "no" direction.

    Free GPUs are counted on every node, asleep ones included, as the engine counts them; a
    request wider than the narrowest node counts once that many whole GPUs are free in all;
    others need a node with that much GPU memory per GPU and that many whole GPUs free (or
    that share of one GPU, for a fraction)."""
    asks = sorted(asks)
    if not asks:
        return False
    v = view
    if float(v.gpu_free.sum()) <= EPS:
        return False
    narrowest = int(v.gpu_total.min())
    total_free = int(v.whole_free.sum())
    share = v.gpu_free.max(axis=1)
    for gpus, mem in asks:
        if gpus > narrowest:
            if total_free >= gpus:
                return True
            continue
        tier = v.gpu_mem_gb >= mem - EPS
        if not tier.any():
            continue
        if gpus < 1.0:
            if float(share[tier].max()) >= gpus - EPS:
                return True
        elif int(v.whole_free[tier].max()) >= gpus:
            return True
    return False
