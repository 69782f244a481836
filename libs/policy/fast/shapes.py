"""A pass's request shapes: the queue's rows grouped by ``filters.shape_key`` and the static
per-shape arrays the guard and the screen read, memoised on the view."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from libs.policy import filters as F
from libs.policy.cluster import ClusterView
from libs.policy.filters import shape_key
from libs.policy.types import PendingJob


def static_masks(view: ClusterView):
    """Builds bool[shape, node]: ``F.static_mask`` of each shape (for ``per_shape``)."""
    return lambda specs: np.stack([F.static_mask(sp, view) for sp in specs])


def shapes_of(jobs: Sequence[PendingJob]) -> tuple[np.ndarray, list[tuple], list]:
    """``PendingQueue.shapes()`` for a plain list of jobs."""
    ids: dict[tuple, int] = {}
    specs = []
    rows = []
    for j in jobs:
        k = shape_key(j.spec)
        s = ids.get(k)
        if s is None:
            s = ids[k] = len(ids)
            specs.append(j.spec)
        rows.append(s)
    return np.array(rows, dtype=np.int64), list(ids), specs


def per_shape(view: ClusterView, name: str, shape_specs: list, build) -> np.ndarray:
    """``build(shape_specs)``, a static array with one entry per shape, memoised on the view.
    A queue only appends to its shape list (``PendingQueue.shapes``), so the same list object
    with the same length holds the same shapes; anything else is keyed by the shapes."""
    key = (name, id(shape_specs), len(shape_specs))
    hit = view.shape_memo.per_shape_list.get(key)
    if hit is not None and hit[0] is shape_specs:
        return hit[1]
    full_key = (name, tuple(map(shape_key, shape_specs)))
    arr = view.shape_memo.per_shape.get(full_key)
    if arr is None:
        arr = view.shape_memo.per_shape[full_key] = build(shape_specs)
    view.shape_memo.per_shape_list[key] = (shape_specs, arr)
    return arr


def present_models(shape_specs: list, view: ClusterView) -> np.ndarray:
    """bool[shape, model]: some node of that GPU model could hold the shape (static)."""
    n_models = len(view.models)
    present = np.zeros((len(shape_specs), n_models), dtype=bool)
    for s, spec in enumerate(shape_specs):
        key = shape_key(spec)
        hit = view.shape_memo.models_of_shape.get(key)
        if hit is None:
            hit = np.zeros(n_models, dtype=bool)
            hit[np.unique(view.model_idx[F.static_mask(spec, view)])] = True
            view.shape_memo.models_of_shape[key] = hit
        present[s] = hit
    return present
