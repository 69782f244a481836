"""The memos of a ``ClusterView``: one typed object per kind, a named field per question, each
filled by one function (named beside it) and kept exactly while its inputs stand.

``ShapeMemo``: answers that depend only on the nodes' specs, which never change in a view, so a
view and its copies share one. ``ViewMemo``: answers about the view's current state, each kept
with the change counter it was computed at (``ClusterView.gen``, ``freed_gen``, ``state_gen``,
``node_gen``); a copy starts with a fresh one. Every memo is checked against the uncached
answer by a property test (``tests/policy/test_fastpath.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(eq=False, slots=True)
class ShapeMemo:
    """Per view and its copies: answers about the nodes' specs only."""

    total_gpus: int | None = None  # ClusterView.total_gpus
    capacity: np.ndarray | None = None  # ClusterView.capacity (read-only)
    model_tables: tuple[Any, Any] | None = None  # scores.ModelTables.build: (profiles, tables)
    default_mix: tuple[Any, Any] | None = None  # scores.default_mix: (cfg.size_mix, SizeMix)
    no_exclusion: np.ndarray | None = None  # backfill.reserve: bool[N] all False (read-only)
    # per request shape (filters.shape_key)
    static_mask: dict[tuple, np.ndarray] = field(default_factory=dict)  # filters.static_mask
    request_row: dict[tuple, np.ndarray] = field(default_factory=dict)  # filters._request_row
    ever_fits: dict[tuple, bool] = field(default_factory=dict)  # filters.can_ever_fit
    gang_ever_fits: dict[tuple, bool] = field(default_factory=dict)  # gang_pass.ever_fits
    models_of_shape: dict[tuple, np.ndarray] = field(default_factory=dict)  # shapes.present_models
    # per slow-model code: bool[N] nodes it does not hold off (fast.codes.fast_nodes)
    fast_nodes: dict[int, np.ndarray] = field(default_factory=dict)
    # fast.shapes.per_shape: (name, shape keys) -> array, and (name, id, len) of a queue's
    # shape list -> (that list, array)
    per_shape: dict[tuple, np.ndarray] = field(default_factory=dict)
    per_shape_list: dict[tuple, tuple[list, np.ndarray]] = field(default_factory=dict)


@dataclass(eq=False, slots=True)
class ViewMemo:
    """Per view: answers about its current state, with the counters they were computed at."""

    load: tuple[int, float] | None = None  # ClusterView.load: (gen, load)
    # filters.available: ((state_gen, thermal_max_c), bool[N] read-only)
    available: tuple[tuple, np.ndarray] | None = None
    fit_now: tuple[int, float, dict] | None = None  # filters.fit_now: (gen, thermal_max_c, {})
    temps_unknown: tuple[int, bool] | None = None  # scores.temps_unknown: (state_gen, answer)
    # step.failed_memo: (freed_gen, cfg, shape key -> why it fits no node)
    failed: tuple[int, Any, dict[tuple, str]] | None = None
    reservation: tuple[tuple, Any] | None = None  # fast.reservations.reserve_head: (key, res)
    # fast.reservations.reserve_extra: job id -> (key, reservation)
    reservation_extra: dict[str, tuple] = field(default_factory=dict)
    # backfill.reserve: shape key -> node -> (node_gen, running ends, earliest start)
    earliest_start: dict[tuple, dict] = field(default_factory=dict)
    # fast.gang_offers.offers_now: (shape key, thermal_max_c) -> ShapeOffers (refreshed where
    # node_gen moved)
    gang_offers: dict[tuple, Any] = field(default_factory=dict)
