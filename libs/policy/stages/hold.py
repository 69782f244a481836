"""The high-priority hold (the definition): whole GPUs of each GPU model kept awake and free
for high-priority jobs, so a burst of ordinary arrivals cannot eat the warm reserve and leave
the next urgent job waiting a boot (``PolicyConfig.warm_high_hold_gpus``; issue 15, item 5:
"high-priority jobs never wait for [a boot] at all when capacity exists").

Why: the warm reserve (``libs.policy.warm``) keeps awake what recent bursts needed, but any
job could take it. Measured at Philly's natural load (seed cluster, 1,024 GPUs, power saving
on every policy, seed 1): of 454 high-priority jobs that waited over 60 s, 281 arrived when no
awake node had room for them and a node that could was booting (the arrivals just before them
had eaten the reserve); 110 arrived when the cluster had no room for them at all. High-priority
submissions come in bursts too: the high-priority GPUs submitted within one boot (300 s)
before a high-priority arrival are 5 at the median, 16 at p90, 52 at p99.

The rule, per GPU model m with a hold h_m > 0 (``hold_gpus``: ``warm_high_hold_gpus`` for a
model that started a high-priority job within the reserve's history, while it has a node
asleep or booting, so an ordinary job held off waits at most about one boot, which the power
plan starts for it as blocked demand):

* a job below high priority may not start on an available (not cordoned) node of m if that
  would leave fewer than h_m whole free GPUs on m's available nodes (``held_nodes``);
* a high-priority job and an inference replica are never held; nor is a gang (it takes
  whole nodes, ``stages.gang``, and waits for them anyway);
* the warm reserve keeps h_m more GPUs awake on such a model (``warm.reserve_nodes``), so
  the hold is spare capacity, not capacity taken from ordinary jobs.

The hold never idles GPUs a held job could use once m has nothing asleep: then every node of
m is up and an urgent job would wait for a running job to end, which a hold cannot shorten.
"""

from __future__ import annotations

import numpy as np

from libs.policy.cluster import EPS
from libs.policy.filters import whole_gpus
from proto.jobs import JobSpec

HIGH_HOLD = "HighHold"  # the wait reason of a job the hold keeps off the held GPUs


def hold_gpus(hold: float, had_high: np.ndarray, sleeping: np.ndarray) -> np.ndarray | None:
    """int[model]: whole GPUs held per GPU model (``hold``: ``warm_high_hold_gpus``;
    ``had_high``: bool, the model started a high-priority job within the reserve's history;
    ``sleeping``: bool, it has a node asleep or booting), or None when nothing is held."""
    on = np.asarray(had_high, dtype=bool) & np.asarray(sleeping, dtype=bool)
    h = np.where(on, int(np.ceil(hold - EPS)), 0).astype(np.int64)
    return h if (h > 0).any() else None


def held_nodes(
    whole_free: np.ndarray, cordoned: np.ndarray, model_idx: np.ndarray, hold: np.ndarray, gpus: int
) -> np.ndarray | None:
    """bool[N]: the nodes a job below high priority asking ``gpus`` whole GPUs (a fraction
    counts as one) may not start on: the available nodes of every model whose available
    whole free GPUs minus ``gpus`` fall below its hold (None: none)."""
    hold = np.asarray(hold)
    avail = ~np.asarray(cordoned, dtype=bool)
    free = np.bincount(model_idx[avail], weights=whole_free[avail], minlength=len(hold))
    binding = (hold > 0) & (free - gpus < hold)
    if not binding.any():
        return None
    held = binding[model_idx] & avail
    return held if held.any() else None


class PassHold:
    """One pass's use of the hold: ``held_nodes`` per GPU count asked, and the request shapes
    the hold alone refused (no other mask on the row), both for the view's current state
    (``view.gen``: a start or an end changes what is free, so neither outlives a change)."""

    __slots__ = ("_fail", "_gen", "_memo", "hold")

    def __init__(self, hold: np.ndarray) -> None:
        self.hold = hold
        self._gen = -1
        self._memo: dict[int, np.ndarray | None] = {}
        self._fail: set[tuple] = set()

    def allowed(self, spec: JobSpec, view) -> np.ndarray | None:
        """bool[N]: the nodes the hold leaves a job below high priority (None: all of them;
        an inference replica is never held)."""
        if spec.kind == "inference":
            return None
        if self._gen != view.gen:
            self._gen = view.gen
            self._memo.clear()
            self._fail.clear()
        g = whole_gpus(spec)
        if g not in self._memo:
            held = held_nodes(view.whole_free, view.cordoned, view.model_idx, self.hold, g)
            self._memo[g] = None if held is None else ~held
        return self._memo[g]

    def refused(self, key: tuple) -> bool:
        return key in self._fail

    def refuse(self, key: tuple) -> None:
        self._fail.add(key)
