"""Filter, as the pass runs it: which nodes can hold a request now (``fit_now``, many shapes at
once: ``fit_now_shapes``), why a request fits nowhere (``refusal_reason``, ``explain_nodes``) and
whether it ever could (``never_fits``), memoised per request shape. The rules are the
definitions of ``libs.policy.stages.filter``; the hot loops are ``fast.fit``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from libs.policy import fast as K
from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.stages.filter import (
    STATIC,
    f_constraints,
    f_cordon,
    f_cpus,
    f_cpus_total,
    f_free_gpus,
    f_gpu_count,
    f_gpu_memory,
    f_host_memory,
    f_host_memory_total,
    f_thermal,
    is_fractional,
    model_allowed,
    shape_key,
    whole_gpus,
)
from proto.jobs import JobSpec
from proto.nodes import NodeSpec


def static_mask(spec: JobSpec, view: ClusterView) -> np.ndarray:
    """Nodes whose shape could ever hold ``spec`` (memoised per request shape on the view;
    treat the result as read-only)."""
    key = shape_key(spec)
    m = view.shape_memo.static_mask.get(key)
    if m is None:
        m = np.ones(len(view.node_ids), dtype=bool)
        for _, f in STATIC:
            m &= f(spec, view)
        m.setflags(write=False)
        view.shape_memo.static_mask[key] = m
    return m


def available(view: ClusterView, cfg: PolicyConfig) -> np.ndarray:
    """Nodes neither cordoned nor too hot (memoised until the view's next cordon/temperature
    change, ``view.state_gen``; read-only)."""
    key = (view.state_gen, cfg.thermal_max_c)
    hit = view.memo.available
    if hit is None or hit[0] != key:
        m = ~view.cordoned & ~(view.temp_c >= cfg.thermal_max_c)
        m.setflags(write=False)
        hit = view.memo.available = (key, m)
    return hit[1]


def fit_now(spec: JobSpec, view: ClusterView, cfg: PolicyConfig) -> np.ndarray:
    """Nodes that could take ``spec`` right now (static and dynamic filters), memoised per
    request shape until the view's next change (``view.gen``): a pass tries many jobs of few
    shapes, and a pass on an unchanged view (no event freed or took anything) asks the same
    questions again. Read-only."""
    memo = _fit_now_memo(view, cfg)
    key = shape_key(spec)
    m = memo.get(key)
    if m is None:
        m = K.fit_one(
            static_mask(spec, view),
            _request_row(spec, key, view),
            available(view, cfg),
            view.whole_free,
            view.host_mem_free_gb,
            view.cpus_free,
            view.gpu_free,
            view.gpu_mem_free_gb,
            EPS,
        )
        m.setflags(write=False)
        memo[key] = m
    return m


def _request_row(spec: JobSpec, key: tuple, view: ClusterView) -> np.ndarray:
    """``shape_requests([spec])[0]``, memoised per request shape on the view."""
    hit = view.shape_memo.request_row.get(key)
    if hit is None:
        hit = view.shape_memo.request_row[key] = shape_requests([spec])[0]
    return hit


def _fit_now_memo(view: ClusterView, cfg: PolicyConfig) -> dict:
    """``fit_now``'s memo (shape key -> mask) for the view as it is now."""
    hit = view.memo.fit_now
    if hit is None or hit[0] != view.gen or hit[1] != cfg.thermal_max_c:
        hit = view.memo.fit_now = (view.gen, cfg.thermal_max_c, {})
    return hit[2]


def shape_requests(specs: Sequence[JobSpec]) -> np.ndarray:
    """float[shape, 6] of request shapes (one spec each): fractional (1.0) or not, whole GPUs
    (``whole_gpus``), host memory, CPUs, GPUs asked, GPU memory: the numbers the dynamic
    filters (``fast.fit_one``, ``fit_whole``) and the scheduler's largest-free-block check
    compare, built once per shape."""
    return np.array(
        [
            (
                float(is_fractional(sp)),
                whole_gpus(sp),
                sp.host_mem_gb,
                sp.cpus,
                sp.gpus,
                sp.gpu_mem_gb,
            )
            for sp in specs
        ],
        dtype=float,
    ).reshape(len(specs), 6)


def fit_now_shapes(
    shapes: np.ndarray,
    specs: Sequence[JobSpec],
    view: ClusterView,
    cfg: PolicyConfig,
    static: np.ndarray,
    requests: np.ndarray,
    keys: Sequence[tuple] | None = None,
) -> tuple[np.ndarray, dict[int, str]]:
    """(``fit_now`` of several request shapes at once, bool[len(shapes), node]; the shapes
    that fit no node now, shape index -> ``refusal_reason(spec)[0]``). ``shapes``: indices
    into ``specs`` (one spec per shape), into ``static`` (their ``static_mask`` rows), into
    ``requests`` (``shape_requests(specs)``) and into ``keys`` (their ``shape_key``s, or
    None); the caller keeps them all. One compiled call (``fast.screen_shapes``: the
    comparisons ``fit_now`` makes and ``refusal_reason``'s dynamic reasons, so the answers
    are the same). Read-only; the rows of the shapes that fit somewhere are filed in
    ``fit_now``'s memo for the view as it is (the pass places rows of those shapes next)."""
    out, why = K.screen_shapes(
        shapes,
        static,
        requests,
        available(view, cfg),
        view.cordoned,
        view.whole_free,
        view.host_mem_free_gb,
        view.cpus_free,
        view.gpu_free,
        view.gpu_mem_free_gb,
        EPS,
    )
    out.setflags(write=False)
    memo = _fit_now_memo(view, cfg)
    refused: dict[int, str] = {}
    for i, (k, w) in enumerate(zip(shapes.tolist(), why.tolist(), strict=True)):
        if w == 0:
            memo.setdefault(shape_key(specs[k]) if keys is None else keys[k], out[i])
        else:
            refused[k] = (
                _REFUSALS[w] if w < len(_REFUSALS) else refusal_reason(specs[k], view, cfg)[0]
            )
    return out, refused


# the reasons ``fast.screen_shapes`` codes (0: fits; 4: never, ``refusal_reason`` tells why)
_REFUSALS = ("", "Resources", "Thermal", "Cordoned")


def explain_nodes(spec: JobSpec, view: ClusterView, cfg: PolicyConfig) -> dict[str, str]:
    """node id -> the first rule it fails (nodes that pass every rule are absent)."""
    k = whole_gpus(spec)
    checks: list[tuple[np.ndarray, Callable[[int], str]]] = [
        (
            f_constraints(spec, view),
            lambda i: (
                f"Constraints: {view.models[view.model_idx[i]]} not in {'|'.join(spec.constraints)}"
            ),
        ),
        (f_gpu_count(spec, view), lambda i: f"GpuCount: node has {view.gpu_total[i]} GPUs < {k}"),
        (
            f_gpu_memory(spec, view),
            lambda i: f"GpuMemory: {view.gpu_mem_gb[i]:g} GB per GPU < {spec.gpu_mem_gb:g} GB",
        ),
        (
            f_host_memory_total(spec, view),
            lambda i: f"HostMemory: node has {view.host_mem_gb[i]:g} GB < {spec.host_mem_gb:g} GB",
        ),
        (f_cpus_total(spec, view), lambda i: f"Cpus: node has {view.cpus[i]:g} < {spec.cpus:g}"),
        (f_cordon(spec, view), lambda i: "Cordoned"),
        (
            f_thermal(spec, view, cfg),
            lambda i: f"Thermal: {view.temp_c[i]:.0f} C >= {cfg.thermal_max_c:g} C",
        ),
        (
            f_free_gpus(spec, view),
            lambda i: (
                f"Resources: no GPU with {spec.gpus:g} share and {spec.gpu_mem_gb:g} GB free"
                if is_fractional(spec)
                else f"Resources: {view.whole_free[i]} free GPUs < {k}"
            ),
        ),
        (
            f_host_memory(spec, view),
            lambda i: (
                f"Resources: {view.host_mem_free_gb[i]:g} GB host "
                f"memory free < {spec.host_mem_gb:g}"
            ),
        ),
        (
            f_cpus(spec, view),
            lambda i: f"Resources: {view.cpus_free[i]:g} CPUs free < {spec.cpus:g}",
        ),
    ]
    out: dict[str, str] = {}
    for i, nid in enumerate(view.node_ids):
        for mask, why in checks:
            if not mask[i]:
                out[nid] = why(i)
                break
    return out


def can_ever_fit(spec: JobSpec, view: ClusterView) -> bool:
    """Some node's shape could hold ``spec`` (the view form of ``never_fits(...) is None``,
    memoised per request shape on the view: O(1) after the first call)."""
    key = shape_key(spec)
    hit = view.shape_memo.ever_fits.get(key)
    if hit is None:
        hit = view.shape_memo.ever_fits[key] = bool(static_mask(spec, view).any())
    return hit


def refusal_reason(spec: JobSpec, view: ClusterView, cfg: PolicyConfig) -> tuple[str, bool]:
    """(Slurm-like reason, never_fits) for a job no node can take now."""
    if can_ever_fit(spec, view):
        m = static_mask(spec, view)
    else:
        m = np.ones(len(view.node_ids), dtype=bool)
        for reason, f in STATIC:
            nxt = m & f(spec, view)
            if not nxt.any():
                return reason, True
            m = nxt
    return _REFUSALS[K.refusal_code(m, available(view, cfg), view.cordoned)], False


def never_fits(spec: JobSpec, nodes: Sequence[NodeSpec]) -> str | None:
    """Why no node of ``nodes`` could hold ``spec`` even empty, or None when one could.
    A caller asking for many jobs on one node list keeps a ``NeverFits`` of it instead."""
    return NeverFits(nodes)(spec)


class NeverFits:
    """``never_fits`` over one node list, memoised per request shape: it answers over the
    distinct node shapes only, once per request shape (``NodeSpec`` is frozen, so the list's
    answers never change). The caller owns it for as long as the list stands."""

    __slots__ = ("_answers", "_nodes", "_shapes", "_view")

    def __init__(self, nodes: Sequence[NodeSpec]) -> None:
        self._nodes = list(nodes)
        self._view: ClusterView | None = None  # built when a gang is first asked about
        shapes: dict[tuple, NodeSpec] = {}
        for n in nodes:
            shapes.setdefault((n.gpu_model, n.gpu_count, n.gpu_mem_gb, n.host_mem_gb, n.cpus), n)
        self._shapes = list(shapes.values())
        self._answers: dict[tuple, str | None] = {}

    def __call__(self, spec: JobSpec) -> str | None:
        key = shape_key(spec)
        if key not in self._answers:
            why = _never_fits(spec, self._shapes)
            if why is not None and why.startswith("GpuCount") and self._gang_fits(spec):
                why = None  # wider than any node, but it fits as a gang over several
            self._answers[key] = why
        return self._answers[key]

    def _gang_fits(self, spec: JobSpec) -> bool:
        """``spec`` is a gang that some model's nodes could hold together (``stages.gang``)."""
        from libs.policy.stages import gang  # the definition imports the filter stage

        if self._view is None:
            self._view = ClusterView.build(self._nodes)
        return gang.is_gang(spec, self._view) and gang.ever_fits(spec, self._view)


def _never_fits(spec: JobSpec, nodes: Sequence[NodeSpec]) -> str | None:
    k = whole_gpus(spec)
    cand = [n for n in nodes if model_allowed(spec.constraints, n.gpu_model)]
    if not cand:
        return f"Constraints: no node has a GPU matching {'|'.join(spec.constraints)}"
    cand2 = [n for n in cand if n.gpu_count >= k]
    if not cand2:
        return f"GpuCount: no eligible node has {k} GPUs (largest {max(n.gpu_count for n in cand)})"
    cand3 = [n for n in cand2 if n.gpu_mem_gb >= spec.gpu_mem_gb - EPS]
    if not cand3:
        top = max(n.gpu_mem_gb for n in cand2)
        return f"GpuMemory: {spec.gpu_mem_gb:g} GB per GPU, eligible nodes have at most {top:g} GB"
    cand4 = [n for n in cand3 if n.host_mem_gb >= spec.host_mem_gb - EPS]
    if not cand4:
        return f"HostMemory: no eligible node has {spec.host_mem_gb:g} GB host memory"
    if not any(n.cpus >= spec.cpus - EPS for n in cand4):
        return f"Cpus: no eligible node has {spec.cpus:g} CPUs"
    return None
