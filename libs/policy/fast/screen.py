"""The bulk walk's screen: which (shape, slow-model code) groups of queued rows cannot start
now, so the walk drops their rows at once (``DeadRows``)."""

from __future__ import annotations

import numpy as np

from libs.policy import fast as K
from libs.policy import filters as F
from libs.policy.cluster import EPS
from libs.policy.fast.codes import SlowCodes
from libs.policy.fast.shapes import per_shape, static_masks

DENSE_KEYS = 1 << 16  # key spaces up to this size are grouped with a table, not a sort


class DeadRows:
    """Rows the bulk walk may drop (``live`` keeps the others): their shape failed in this pass or
    is larger than the largest free block (and fits some node when empty), or their (shape,
    slow-model code) was refused SlowGPU in this pass. Every one of these facts is about a
    group of rows, (shape, code): ``assign`` puts each candidate row in its group once (the
    codes are fixed for the pass), the pass marks groups dead as it learns, and a check is
    one lookup per row (``dead_g[group_of_row[row]]``)."""

    def __init__(
        self, shape_of, shape_specs, codes: SlowCodes, bits: int, view, gangs=None
    ) -> None:
        """``gangs``: bool per shape, the gangs (``gang_pass``), or None: their rows are never
        screened (they fit no one node, yet may start over several), only dropped once their
        shape failed in the pass, as the pass tells (``failed_shapes``)."""
        self.gangs = gangs
        self.shape_of = shape_of
        self.codes = codes
        self.bits = bits
        # per shape: fractional or not, whole GPUs, ..., GPUs asked (filters.shape_requests)
        self.requests = per_shape(view, "requests", shape_specs, F.shape_requests)
        self.ever = per_shape(
            view,
            "ever",
            shape_specs,
            lambda specs: np.array([F.can_ever_fit(sp, view) for sp in specs], dtype=bool),
        )
        self.failed = np.zeros(len(shape_specs), dtype=bool)
        self.too_big = np.zeros(len(shape_specs), dtype=bool)
        self.pairs: set[int] = set()
        self.group_of_row = np.full(len(shape_of), -1, dtype=np.int64)
        self.g_key = np.zeros(0, dtype=np.int64)  # (shape << bits) + code per group, sorted
        self.g_shape = np.zeros(0, dtype=np.int64)
        self.g_code = np.zeros(0, dtype=np.int64)
        self.g_pair = np.zeros(0, dtype=bool)  # the group's (shape, code) was refused
        self.g_nofit = np.zeros(0, dtype=bool)  # the group fits nowhere it may go (screen)
        self._dead_g: np.ndarray | None = np.zeros(0, dtype=bool)  # ``dead_g``, None: stale
        self.all_nodes = np.ones(len(view.node_ids), dtype=bool)

    def assign(self, rows: np.ndarray) -> None:
        """Put ``rows`` in their (shape, code) groups (once per pass, before any check)."""
        # a row whose shape is already dead stays dead for the pass (failed and too-big
        # shapes only grow as resources are taken): its slow-model code does not matter
        shape_dead = self.failed | self.too_big
        self.codes.fill(rows, shape_dead)
        span = len(self.requests) << self.bits
        if span <= DENSE_KEYS:  # one compiled call: keys, groups, each row's group
            uniq, self.g_shape, self.g_code = K.group_rows(
                rows,
                self.shape_of,
                shape_dead,
                self.codes.cache,
                self.bits,
                span,
                self.group_of_row,
            )
        else:
            keys = K.row_keys(rows, self.shape_of, shape_dead, self.codes.cache, self.bits)
            uniq, inv = np.unique(keys, return_inverse=True)
            self.group_of_row[rows] = inv
            self.g_shape = uniq >> self.bits
            self.g_code = uniq & ((1 << self.bits) - 1)
        self.g_key = uniq
        self.g_pair = (
            np.fromiter((k in self.pairs for k in uniq.tolist()), dtype=bool, count=len(uniq))
            if self.pairs
            else np.zeros(len(uniq), dtype=bool)
        )
        self.g_nofit = np.zeros(len(uniq), dtype=bool)
        self._refresh()

    def screen(self, view, cfg, allowed_nodes, shape_specs, shape_keys, failed) -> None:
        """Mark dead every group that cannot start on the view as it is now: its shape fits
        no node (recorded in ``failed`` as ``place`` would), or, for a group the slow-GPU
        guard holds off some models, it fits no node that is fast enough and not reserved
        (``allowed_nodes``: bool[N] not reserved, or None). Exactly the answer ``place``
        would give each of its rows, for all groups at once: resources only shrink during a
        pass, so a dead group stays dead."""
        gi = np.flatnonzero(~self.dead_g)
        if self.gangs is not None:
            gi = gi[~self.gangs[self.g_shape[gi]]]
        if not len(gi):
            return
        shapes, inv = K.unique_sorted(self.g_shape[gi])  # g_shape is sorted (by g_key)
        static = per_shape(view, "static_masks", shape_specs, static_masks(view))
        fits, refused = F.fit_now_shapes(
            shapes, shape_specs, view, cfg, static, self.requests, shape_keys
        )
        if refused:
            for k, w in refused.items():
                failed[shape_keys[k]] = w
            self.failed[list(refused)] = True
        allowed = self.all_nodes if allowed_nodes is None else allowed_nodes
        ok = K.groups_fit(fits, inv, self.g_code[gi], view.model_idx, allowed)
        self.g_nofit[gi[~ok]] = True
        self._refresh()

    def _refresh(self) -> None:
        """The groups' facts changed: ``dead_g`` is recomputed when next read (a pass often
        learns several facts in a row, e.g. a placement's smaller free blocks and a failed
        shape, before it filters rows again)."""
        self._dead_g = None

    @property
    def dead_g(self) -> np.ndarray:
        """bool per group: dead (its shape failed or is too big, its (shape, code) was refused,
        or it fits nowhere it may go)."""
        d = self._dead_g
        if d is None:
            d = self._dead_g = K.dead_groups(
                self.g_shape, self.failed, self.too_big, self.g_pair, self.g_nofit
            )
        return d

    def failed_shapes(self, shape_ids) -> None:
        for s in shape_ids:
            self.failed[s] = True
        self._refresh()

    def slow_refused(self, shape_id: int, code: int) -> None:
        k = (shape_id << self.bits) + code
        self.pairs.add(k)
        g = int(np.searchsorted(self.g_key, k))
        if g < len(self.g_key) and self.g_key[g] == k:
            self.g_pair[g] = True
            if self._dead_g is not None:
                self._dead_g[g] = True

    def block(self, max_share: float, max_whole: int) -> None:
        """The largest free blocks shrank: shapes above them cannot start in this pass."""
        self.too_big = K.too_big(self.requests, self.ever, max_share, max_whole, EPS)
        self._refresh()

    def live(self, rows: np.ndarray) -> np.ndarray:
        """The rows of ``rows`` not dead, in the order given
        (``rows[~dead_g[group_of_row[rows]]]``)."""
        return K.live_rows(rows, self.group_of_row, self.dead_g)
