"""Sharing a GPU (issue 16), the definitions: a fractional job joins a GPU that others already
share only where the interference model (``libs.policy.interference``) says every job there
stays within its bound.

The rule (``joins_ok``): job J may join the fractional residents R of one GPU slot when

* J's slowdown beside all of R is at most J's bound, and
* every resident's slowdown beside the others and J is at most that resident's bound.

A job's bound (``max_slowdown``, a factor on its runtime alone): ``share_max_slowdown``; for a
job with a latency target (``JobSpec.latency_p99_ms``) also its target / its solo p99
(``solo_latency_p99_ms``), or ``share_latency_unknown_max_slowdown`` when its solo latency is
unknown (a conservative guess, said in ``PolicyConfig``). The latency model: a replica's p99
grows by the same factor as its runtime. That is optimistic for the tail (contention hurts the
tail more than the mean) and is why the unknown-solo bound is tight.

An empty GPU, or one whose residents are whole-GPU jobs, is no question of sharing: a whole
GPU job holds the entire GPU, so no fraction can go there. A resident whose spec the ledger
did not carry is taken as class "other" with the general bound (estimated, never refused).

``slot_ok`` is the readable definition over all slots; placement masks the compiled kernel's
input with ``blocked_free`` (the same rule, asked only of the slots the job fits by share and
memory), checked against ``slot_ok`` in ``tests/policy/test_share.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.interference import InterferenceModel
from proto.jobs import JobSpec

INTERFERENCE = "Interference"  # the wait reason: it fits only beside jobs it would slow too much
UNKNOWN_CLASS = "other"


def max_slowdown(spec: JobSpec | None, cfg: PolicyConfig) -> float:
    """The largest factor sharing may slow ``spec`` by (module docstring)."""
    bound = cfg.share_max_slowdown
    if spec is None or spec.latency_p99_ms is None:
        return bound
    solo = spec.solo_latency_p99_ms
    headroom = spec.latency_p99_ms / solo if solo else cfg.share_latency_unknown_max_slowdown
    return min(bound, headroom)


def class_of(spec: JobSpec | None) -> str:
    return UNKNOWN_CLASS if spec is None else spec.workload_class


def joins_ok(
    spec: JobSpec,
    residents: Sequence[JobSpec | None],
    model: InterferenceModel,
    cfg: PolicyConfig,
) -> bool:
    """May ``spec`` join a GPU where ``residents`` (fractional jobs) run? Every side within
    its bound (module docstring)."""
    if not residents:
        return True
    mine = spec.workload_class
    classes = [class_of(r) for r in residents]
    if model.slowdown_among(mine, classes) > max_slowdown(spec, cfg) + EPS:
        return False
    for k, r in enumerate(residents):
        others = [*classes[:k], *classes[k + 1 :], mine]
        if model.slowdown_among(classes[k], others) > max_slowdown(r, cfg) + EPS:
            return False
    return True


def slot_ok(
    spec: JobSpec, view: ClusterView, model: InterferenceModel, cfg: PolicyConfig
) -> np.ndarray:
    """bool[N, Gmax]: the GPU slots ``spec`` may share with their residents (the definition;
    slots without fractional residents are True)."""
    out = np.ones(view.gpu_free.shape, dtype=bool)
    for (i, j), here in view.residents.items():
        out[i, j] = joins_ok(spec, list(here.values()), model, cfg)
    return out


def blocked_free(
    spec: JobSpec, view: ClusterView, model: InterferenceModel, cfg: PolicyConfig
) -> np.ndarray | None:
    """``view.gpu_free`` with the slots ``spec`` fits (share and GPU memory) but may not share
    set to 0 (they look full to the compiled filter and score), or None when no such slot
    exists. ``slot_ok`` asked only where it can change the answer: partly taken slots that
    fit (a partly taken slot holds fractions only: a whole-GPU job takes all of it), once per
    distinct set of residents (``joins_ok`` reads a resident's class and bound alone)."""
    if not view.residents:
        return None
    free = view.gpu_free
    fits = (free >= spec.gpus - EPS) & (free < 1.0 - EPS)
    fits &= view.gpu_mem_free_gb >= spec.gpu_mem_gb - EPS
    out = None
    seen: dict[tuple, bool] = {}
    for i, j in zip(*np.nonzero(fits), strict=True):
        here = view.residents.get((int(i), int(j)))
        if not here:
            continue
        specs = list(here.values())
        key = tuple(sorted((class_of(r), max_slowdown(r, cfg)) for r in specs))
        ok = seen.get(key)
        if ok is None:
            ok = seen[key] = joins_ok(spec, specs, model, cfg)
        if not ok:
            if out is None:
                out = free.copy()
            out[i, j] = 0.0
    return out


def free_for(
    spec: JobSpec, view: ClusterView, cfg: PolicyConfig, model: InterferenceModel | None = None
) -> np.ndarray:
    """The free GPU shares ``spec`` may use: ``blocked_free`` when the rule is on and blocks a
    slot, else ``view.gpu_free`` (read-only use)."""
    if not cfg.share_interference or spec.gpus >= 1.0 - EPS:
        return view.gpu_free
    masked = blocked_free(spec, view, model or InterferenceModel.default(), cfg)
    return view.gpu_free if masked is None else masked


def why_not(
    spec: JobSpec,
    residents: Sequence[JobSpec | None],
    model: InterferenceModel,
    cfg: PolicyConfig,
) -> str:
    """Why ``joins_ok`` refuses (for "why is my job pending"): the first side past its bound,
    with its modelled slowdown and the bound."""
    mine = spec.workload_class
    classes = [class_of(r) for r in residents]
    got, bound = model.slowdown_among(mine, classes), max_slowdown(spec, cfg)
    if got > bound + EPS:
        return f"Interference: beside {'+'.join(classes)} it would run {got:.3f}x > {bound:.3f}x"
    for k, r in enumerate(residents):
        others = [*classes[:k], *classes[k + 1 :], mine]
        got, bound = model.slowdown_among(classes[k], others), max_slowdown(r, cfg)
        if got > bound + EPS:
            who = "a resident" if r is None else r.id
            return f"Interference: {who} ({classes[k]}) would run {got:.3f}x > {bound:.3f}x"
    return ""


def explain_nodes(
    spec: JobSpec, view: ClusterView, nodes: np.ndarray, model: InterferenceModel, cfg: PolicyConfig
) -> dict[str, str]:
    """node id -> why ``spec`` may share none of the GPUs of ``nodes`` that fit it (nodes
    where the rule blocks every fitting slot; the first blocked slot's reason)."""
    out: dict[str, str] = {}
    for n in nodes.tolist():
        for j in range(int(view.gpu_total[n])):
            here = view.residents.get((n, j))
            fits = view.gpu_free[n, j] >= spec.gpus - EPS
            if here and fits and view.gpu_mem_free_gb[n, j] >= spec.gpu_mem_gb - EPS:
                why = why_not(spec, list(here.values()), model, cfg)
                if why:
                    out[view.node_ids[n]] = f"GPU {j}: {why}"
                    break
    return out
