"""The warm reserve: how many empty nodes of each GPU model power saving keeps awake.

Why: a node idle ``suspend_after_s`` is suspended, and a job that then finds every awake node of
the GPU model it wants busy waits a boot (``resume_s``) while the cluster is mostly idle: at
Philly's natural load (a third of capacity) most waits were such boots. Slurm's answer is a
static count of nodes kept up (``SuspendExcNodes``); here the count follows the recent demand,
so a quiet model sleeps and a busy one keeps what its bursts need.

The rule, per GPU model m (``PolicyConfig.warm_*``), a pure definition (``reserve_nodes``):

* the *burst* of a start j on m is the GPUs started on m in the boot time before it,
  ``(t_j - resume_s, t_j]``, j included. A reserve of B free GPUs that is refilled within one
  boot whenever a start eats into it (the power plan wakes nodes at once) lets start j go
  without waiting when its burst is at most B;
* B_m is the ``warm_quantile`` of the bursts of the starts on m within the last
  ``warm_history_s``: that share of the recent starts would have found room awake;
* head-room: plus the widest high-priority request started on m within the history
  (``warm_high_headroom``), so a high-priority job that arrives at the end of a burst still
  finds its GPUs awake;
* the high-priority hold: plus ``warm_high_hold_gpus`` on a model that started a
  high-priority job within the history (``stages.hold`` keeps them for such jobs);
* in whole nodes: ceil((B_m + head-room + hold) / GPUs of m's widest node), and at least
  ``warm_min_nodes`` for a model that started any job within the history (a model nobody used
  keeps none: its first job wakes a node for it).

Starts, not arrivals, are the demand: a start on m is what the reserve of m must absorb, and a
job the slow-GPU guard held for a fast model counts where it finally started. Both drivers feed
the same starts (``core.Scheduler`` books every start; the simulator's ``PowerSaving`` wrapper
its baseline's), so the reserve is the same wherever the rule runs.
"""

from __future__ import annotations

import bisect
import math
from collections import deque

import numpy as np

from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig

EPS = 1e-9


def bursts(times_s: np.ndarray, gpus: np.ndarray, window_s: float) -> np.ndarray:
    """float[j]: GPUs started in ``(times_s[j] - window_s, times_s[j]]`` (``times_s`` sorted,
    ascending), start j included."""
    cs = np.cumsum(np.asarray(gpus, dtype=float))
    lo = np.searchsorted(times_s, np.asarray(times_s) - window_s, side="right")
    before = np.where(lo > 0, cs[np.maximum(lo - 1, 0)], 0.0)
    return cs - before


def reserve_nodes(
    times_s: np.ndarray,
    gpus: np.ndarray,
    high: np.ndarray,
    *,
    now: float,
    node_gpus: float,
    cfg: PolicyConfig,
) -> tuple[int, float, float]:
    """(empty nodes to keep awake, burst GPUs, high-priority head-room GPUs) for one GPU model
    at ``now`` from its starts (``times_s`` ascending, none after ``now``; ``high``:
    high-priority starts). A start's burst counts every start before it, also one older than
    the history; the quantile and the head-room read the starts within the history. See the
    module docstring for the rule."""
    recent = np.asarray(times_s) > now - cfg.warm_history_s
    if not recent.any() or not cfg.warm_reserve:
        return 0, 0.0, 0.0
    b = bursts(times_s, gpus, cfg.resume_s)[recent]
    gpus, high = np.asarray(gpus)[recent], np.asarray(high, dtype=bool)[recent]
    # the inverted-CDF quantile (numpy's method="inverted_cdf"): the smallest burst that at
    # least that share of the starts did not exceed, a burst that happened, never an
    # interpolation between two (a partition: np.quantile's overhead was most of a replay's
    # power step)
    k = max(0, math.ceil(cfg.warm_quantile * len(b) - EPS) - 1)
    burst = float(np.partition(b, k)[k])
    head = float(np.max(gpus[high])) if cfg.warm_high_headroom and high.any() else 0.0
    hold = cfg.warm_high_hold_gpus if high.any() else 0.0  # stages.hold's GPUs, kept awake
    nodes = math.ceil((burst + head + hold) / max(node_gpus, 1.0) - EPS)
    return max(cfg.warm_min_nodes, nodes), burst, head


class WarmHistory:
    """The starts of the last ``warm_history_s`` per GPU model of a view (the reserve's input),
    and the reserve they give (memoised until a start is added or one ages out)."""

    def __init__(self, view: ClusterView, cfg: PolicyConfig) -> None:
        self.cfg = cfg
        self.models = tuple(view.models)
        n_models = len(self.models)
        self.node_gpus = np.zeros(n_models)
        np.maximum.at(self.node_gpus, view.model_idx, view.gpu_total)
        self._t: list[list[float]] = [[] for _ in range(n_models)]
        self._g: list[list[float]] = [[] for _ in range(n_models)]
        self._hi: list[list[bool]] = [[] for _ in range(n_models)]
        # each start's burst, kept as it is appended (a burst reads only earlier starts): a
        # running sum over the starts of the last boot time, from ``_win`` on
        self._burst: list[list[float]] = [[] for _ in range(n_models)]
        self._win = [0] * n_models
        self._win_gpus = [0.0] * n_models
        self._head = [0] * n_models  # entries before this have aged out
        # the reserve's two statistics kept as entries come and age out, so a recompute
        # reads them instead of scanning the history (``_reserve``): the bursts from
        # ``_head`` on, sorted (the quantile is one index), and the high-priority starts
        # from ``_head`` on that no later high-priority start is at least as wide as, as
        # (entry number, GPUs), widest first (the head-room is the first); an entry number
        # counts from the model's first start (``_dropped``: entries compacted away)
        self._sorted: list[list[float]] = [[] for _ in range(n_models)]
        self._widest: list[deque[tuple[int, float]]] = [deque() for _ in range(n_models)]
        self._dropped = [0] * n_models
        self._version = [0] * n_models  # bumped by each start on the model
        # per model: (version, valid from, valid until) of its ``_detail``
        self._valid: list[tuple[int, float, float] | None] = [None] * n_models
        self._detail: list[tuple[int, float, float]] = [(0, 0.0, 0.0)] * n_models
        self._keep = np.zeros(n_models, dtype=np.int64)
        self._keep.setflags(write=False)

    def started(self, model: int, gpus: float, high: bool, now: float) -> None:
        """A job started on a node of GPU model ``model`` (view index) at ``now``."""
        if not self.cfg.warm_reserve:
            return
        t, g = self._t[model], self._g[model]
        lo, win = self._win[model], self._win_gpus[model]
        while lo < len(t) and t[lo] <= now - self.cfg.resume_s:  # ``bursts``' window
            win -= g[lo]
            lo += 1
        if lo == len(t):
            win = 0.0  # an empty window: no rounding left over from the sums
        win += float(gpus)
        self._win[model], self._win_gpus[model] = lo, win
        widest = self._widest[model]
        if high:
            while widest and widest[-1][1] <= gpus:  # never the widest again while gpus is in
                widest.pop()
            widest.append((self._dropped[model] + len(t), float(gpus)))
        t.append(float(now))
        g.append(float(gpus))
        self._hi[model].append(bool(high))
        self._burst[model].append(win)
        bisect.insort(self._sorted[model], win)
        self._version[model] += 1

    def keep(self, now: float) -> tuple[np.ndarray, float]:
        """(int[model]: empty nodes to keep awake (read-only), when that may next change by
        ageing alone: inf if never). A model's figure is recomputed only when a start was
        added to it or its oldest start aged out."""
        nxt = math.inf
        changed = False
        for m in range(len(self.models)):
            valid = self._valid[m]
            if valid is None or valid[0] != self._version[m] or not valid[1] <= now < valid[2]:
                self._recompute(m, now)
                changed = True
            nxt = min(nxt, self._valid[m][2])  # type: ignore[index]
        if changed:
            keep = np.array([d[0] for d in self._detail], dtype=np.int64)
            keep.setflags(write=False)
            self._keep = keep
        return self._keep, nxt

    def had_high(self, now: float) -> np.ndarray:
        """bool[model]: the model started a high-priority job within the history (the
        models ``stages.hold`` keeps GPUs on)."""
        self.keep(now)
        return np.array([bool(w) for w in self._widest], dtype=bool)

    def _recompute(self, m: int, now: float) -> None:
        """Model ``m``'s reserve from its starts within the history as of ``now``."""
        horizon = now - self.cfg.warm_history_s
        t = self._t[m]
        h = self._head[m]
        sorted_b, burst = self._sorted[m], self._burst[m]
        while h < len(t) and t[h] <= horizon:
            del sorted_b[bisect.bisect_left(sorted_b, burst[h])]  # aged out: its burst goes
            h += 1
        widest = self._widest[m]
        while widest and widest[0][0] < self._dropped[m] + h:
            widest.popleft()
        cut = min(h, self._win[m])  # the burst window may still need aged-out starts
        if cut > 1024 and cut * 2 > len(t):  # compact: the aged-out part is most of the list
            del t[:cut], self._g[m][:cut], self._hi[m][:cut], self._burst[m][:cut]
            h -= cut
            self._win[m] -= cut
            self._dropped[m] += cut
        self._head[m] = h
        if h == len(t):
            self._detail[m] = (0, 0.0, 0.0)
            self._valid[m] = (self._version[m], now, math.inf)
            return
        self._detail[m] = self._reserve(m)
        self._valid[m] = (self._version[m], now, t[h] + self.cfg.warm_history_s)

    def _reserve(self, m: int) -> tuple[int, float, float]:
        """``reserve_nodes`` of model ``m``'s starts from ``_head`` on, from the bursts kept as
        they were appended, sorted, and the widest high-priority start kept as starts come
        and age out: two reads, not a pass over the history (tested equal:
        ``tests/policy/test_warm.py``)."""
        cfg = self.cfg
        if not cfg.warm_reserve:
            return 0, 0.0, 0.0
        b = self._sorted[m]  # the bursts of the starts from ``h`` on, ascending
        k = max(0, math.ceil(cfg.warm_quantile * len(b) - EPS) - 1)
        burst = float(b[k])  # the k-th smallest, as ``reserve_nodes``' partition gives
        head = 0.0
        if cfg.warm_high_headroom and self._widest[m]:
            head = self._widest[m][0][1]
        hold = cfg.warm_high_hold_gpus if self._widest[m] else 0.0  # stages.hold's GPUs
        nodes = math.ceil((burst + head + hold) / max(float(self.node_gpus[m]), 1.0) - EPS)
        return max(cfg.warm_min_nodes, nodes), burst, head

    def describe(self, model: int, now: float) -> str:
        """Why model ``model`` keeps what it keeps awake, in words (for reasons and explain)."""
        keep, _ = self.keep(now)
        n, burst, head = self._detail[model]
        if n == 0:
            return f"{self.models[model]}: no start in the last {self.cfg.warm_history_s:.0f} s"
        return (
            f"{self.models[model]} keeps {int(keep[model])} empty node(s) awake: "
            f"q{self.cfg.warm_quantile:g} burst {burst:g} GPUs started within a boot "
            f"({self.cfg.resume_s:.0f} s) over the last {self.cfg.warm_history_s:.0f} s, "
            f"+{head:g} GPUs high-priority head-room{self._hold_words(model)}, "
            f"at least {self.cfg.warm_min_nodes}"
        )

    def _hold_words(self, model: int) -> str:
        """The hold's part of ``describe`` ("" when it keeps nothing on the model)."""
        hold = self.cfg.warm_high_hold_gpus
        return f" +{hold:g} GPUs held for high priority" if hold and self._widest[model] else ""
