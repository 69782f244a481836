"""The slow-GPU / energy guard: which GPU models a long queued job is held off for now
(``PolicyConfig``: ``slow_guard_*``, ``energy_guard_factor``, ``green_*``)."""

from __future__ import annotations

import numpy as np

from libs.policy import fast as K
from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.fast.shapes import per_shape, present_models
from libs.policy.placement import PlaceContext
from libs.policy.queue import PendingQueue
from libs.policy.queue_arrays import COLUMNS, QueueArrays, take
from libs.policy.stages.guard import guard_args
from proto.jobs import HIGH_PRIORITY

_INFERENCE = COLUMNS.index("inference")  # 2.0: a service's replica (queue.py)


def held_nodes(codes: np.ndarray, view: ClusterView) -> np.ndarray:
    """bool[code, node]: the node's GPU model is held by that slow-model code (bit m: model
    m of the view, see ``hold_waits``)."""
    return ((codes[:, None] >> view.model_idx[None, :]) & 1) == 1


def fast_nodes(code: int, view: ClusterView) -> np.ndarray:
    """bool[N]: the nodes whose GPU model a slow-model code does not hold (``held_nodes``'s
    complement), memoised on the view (static: codes and models are fixed). Read-only."""
    hit = view.shape_memo.fast_nodes.get(code)
    if hit is None:
        hit = view.shape_memo.fast_nodes[code] = ~held_nodes(np.array([code]), view)[0]
        hit.setflags(write=False)
    return hit


class SlowCodes:
    """The slow-model codes of the queue's rows (bit m: GPU model m of the view is held off for
    now, ``hold_waits``), computed for the rows asked only (one compiled call per batch: a
    row at a time in the row-by-row walk, all candidates at once in bulk) and kept for the
    pass: a long queue is never scanned whole for it. The part that does not move with
    time (``hold_waits``: per row and model, how long the job is held) is kept ACROSS passes
    in a ``PendingQueue`` column, so a pass only compares it with each row's wait."""

    def __init__(self, pending, q, shape_of, shape_specs, view, ctx, cfg, now) -> None:
        self.pending, self.q, self.shape_of = pending, q, shape_of
        self.view, self.ctx, self.cfg, self.now = view, ctx, cfg, float(now)
        self.cache = np.full(len(pending), -1, dtype=np.int64)
        self.present = per_shape(
            view, "present_models", shape_specs, lambda specs: present_models(specs, view)
        )
        n_models = len(view.models)
        self.no_dead = np.zeros(len(shape_specs), dtype=bool)
        if isinstance(pending, PendingQueue):
            # valid while the profile tables, the config and the nodes' specs are the same
            inputs = (ctx.tables, cfg, view.shape_memo)
            self.waits = pending.column("hold_waits", n_models, inputs)
            # per row, the code it got last and the waits it holds between: (code, since,
            # until). A code only changes when a wait crosses one of its thresholds, so a
            # later pass reuses it while since <= wait < until (the same comparisons)
            self.kept = pending.column("slow_code", 3, inputs)
            self.enq = pending.enq()
        else:  # the same columns, kept for this pass only
            self.waits = np.full((len(pending), n_models), np.nan)
            self.kept = np.full((len(pending), 3), np.nan)
            self.enq = q.enq

    def rows(self, rows: np.ndarray) -> np.ndarray:
        self.fill(rows, self.no_dead)
        return self.cache[rows]

    def fill(self, rows: np.ndarray, shape_dead: np.ndarray) -> None:
        """Put the code of each row of ``rows`` whose shape is not dead (``shape_dead``: bool
        per shape) in ``self.cache``."""
        waits = self.waits
        new = K.row_codes(
            rows, self.shape_of, shape_dead, self.cache, self.kept, waits, self.enq, self.now
        )
        if len(new):  # queued since their hold waits were last needed
            present = self.present[self.shape_of[new]]
            if isinstance(self.pending, PendingQueue):
                waits[new] = hold_waits_of_rows(self.pending, new, present, self.ctx, self.cfg)
                kind = self.pending.table()[new, _INFERENCE]
            else:
                waits[new] = hold_waits(take(self.q, new), present, self.ctx, self.cfg)
                kind = self.q.inference[new]
            # a service's replica is never held (-inf): it has no runtime to lose on a slower
            # GPU (it serves until stopped; its rps_per_replica is per reference GPU)
            waits[new[kind > 1.5]] = -np.inf
            K.codes_from_waits(new, waits, self.enq, self.now, self.cache, self.kept)

    def row(self, i: int) -> int:
        c = int(self.cache[i])
        return c if c >= 0 else int(self.rows(np.array([i], dtype=np.int64))[0])


def hold_waits(
    q: QueueArrays, present: np.ndarray, ctx: PlaceContext, cfg: PolicyConfig
) -> np.ndarray:
    """float[row, model]: the job is held off that model while it has waited less than this
    (-inf: never held): the rule of ``stages.guard.hold_waits``, in one compiled loop per row
    and model (``fast.hold_waits``, bit for bit the same). Computed once per queued job; a pass
    then only compares it with the job's wait (``fast.row_codes``: bit m of the slow-model
    code is ``threshold > waited``; tests/policy/test_slow_codes.py checks the codes against
    the rule written per job)."""
    return K.hold_waits(
        q.cls,
        q.est,
        q.prog,
        q.prio,
        q.deadline,
        float(HIGH_PRIORITY),
        q.es,
        q.gpus,
        present,
        ctx.tables.speed,
        ctx.tables.energy_per_work,
        guard_args(cfg),
    )


def hold_waits_of_rows(
    pending: PendingQueue, rows: np.ndarray, present: np.ndarray, ctx: PlaceContext, cfg
) -> np.ndarray:
    """``hold_waits(pending.rows(rows), ...)``, read from the queue's table in place
    (``fast.hold_waits_table``, the same per-job rule): a pass asks it for the one or two
    jobs queued since the last, and building their columns cost more than the rule."""
    return K.hold_waits_table(
        pending.table(),
        rows,
        float(HIGH_PRIORITY),
        present,
        ctx.tables.speed,
        ctx.tables.energy_per_work,
        guard_args(cfg),
    )
