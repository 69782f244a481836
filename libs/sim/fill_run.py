"""FGD's fill experiment (Weng et al., ATC'23, section 6) in ``mosaic sim --fill``.

Pods of an openb pod list arrive one at a time in an order shuffled by the seed and never
leave; each is placed at once or fails. Arrivals go on until the arrived GPU request (placed or
not) reaches ``fill`` x the cluster's GPUs; the pod list is repeated, each copy shuffled anew,
when one pass over it is not enough (the default list asks about 103% of its 6,212 GPUs). The
figure: the GPU allocation ratio (allocated GPU share / GPUs) when the arrived request first
reaches each whole percent, ``alloc_at_arrived["0"]`` ... ``["130"]``.

The target workload for FGD's measure is learnt from the pods that arrived so far, relearnt at
each whole percent (``stages.frag.Workload.learn``). ``run_fill`` runs one seed; the results
dict follows ``run_simulation``'s (``policies`` -> metrics per policy).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from libs.policy.config import PolicyConfig
from libs.policy.stages.frag import Workload
from libs.sim.fill_policy import FillPolicy
from proto.jobs import JobSpec
from proto.nodes import NodeSpec

FILL_POLICIES: tuple[str, ...] = ("random", "bestfit", "fgd", "mosaic", "mosaic+defrag")


def make_fill_policy(name: str) -> FillPolicy:
    """A fresh fill policy by name (``FILL_POLICIES``)."""
    key = name.strip().lower()
    if key == "random":
        from libs.sim.baselines.random_fit import RandomFit

        return RandomFit()
    if key == "bestfit":
        from libs.sim.baselines.bestfit import BestFit

        return BestFit()
    if key == "fgd":
        from libs.sim.baselines.fgd import Fgd

        return Fgd()
    if key in ("mosaic", "mosaic+defrag"):
        from libs.sim.fill_mosaic import MosaicFill

        p = MosaicFill(defrag=key == "mosaic+defrag")
        p.name = key
        return p
    raise ValueError(f"unknown fill policy {name!r}; known: {', '.join(FILL_POLICIES)}")


def arrivals(pods: Sequence[JobSpec], capacity_gpus: float, fill: float, seed: int) -> list:
    """The arrival order: shuffled copies of ``pods`` (ids suffixed ``~k`` from the second
    copy) until their GPU request reaches ``fill`` x ``capacity_gpus``."""
    if fill <= 0 or not math.isfinite(fill):
        raise ValueError(f"fill must be a positive number, got {fill}")
    per_copy = sum(max(0.0, p.gpus) for p in pods)
    if per_copy <= 0:
        raise ValueError("the pod list asks for no GPU")
    rng = np.random.default_rng(seed)
    out: list[JobSpec] = []
    need, got, k = fill * capacity_gpus, 0.0, 0
    while got < need - 1e-9:
        for i in rng.permutation(len(pods)).tolist():
            p = pods[i] if k == 0 else msgspec.structs.replace(pods[i], id=f"{pods[i].id}~{k}")
            out.append(p)
            got += max(0.0, p.gpus)
            if got >= need - 1e-9:
                break
        k += 1
    return out


def fill_one(
    policy: FillPolicy,
    nodes: Sequence[NodeSpec],
    order: Sequence[JobSpec],
    *,
    fill: float,
    seed: int,
    cfg: PolicyConfig,
    progress: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """Run one policy over ``order``; its metrics (``alloc_at_arrived`` and counters)."""
    policy.attach(nodes, seed=seed, cfg=cfg)
    capacity = float(sum(n.gpu_count for n in nodes))
    last_pct = math.floor(fill * 100 + 1e-9)
    alloc: dict[str, float] = {"0": 0.0}
    arrived, placed, failed, failed_gpus = 0.0, 0, 0, 0.0
    seen: list[JobSpec] = []
    next_pct, relearn = 1, True
    for t, spec in enumerate(order):
        seen.append(spec)
        if relearn:  # the first pod, then at each whole percent arrived
            policy.learn(Workload.learn(seen))
            relearn = False
        if policy.place(spec, float(t)):
            placed += 1
        else:
            failed += 1
            failed_gpus += max(0.0, spec.gpus)
        arrived += max(0.0, spec.gpus)
        while next_pct <= last_pct and arrived >= next_pct * capacity / 100 - 1e-9:
            alloc[str(next_pct)] = policy.allocated_gpus() / capacity
            next_pct += 1
            relearn = True
        if progress is not None and t % 200 == 0:
            progress(min(1.0, arrived / (fill * capacity)))
    return {
        "alloc_at_arrived": alloc,
        "pods_arrived": len(order),
        "pods_placed": placed,
        "pods_failed": failed,
        "failed_gpus": failed_gpus,
        "allocated_gpus": policy.allocated_gpus(),
        **policy.stats(),
    }


def run_fill(
    trace: str,
    cluster: str,
    policies: Sequence[str],
    out_dir: Path | None,
    *,
    fill: float,
    seed: int,
    traces_dir: Path | None = None,
    cfg: PolicyConfig | None = None,
    overrides: dict[str, Any] | None = None,
    pods: Sequence[JobSpec] | None = None,
    nodes: Sequence[NodeSpec] | None = None,
    progress: Callable[[str, float], None] | None = None,
) -> dict[str, Any]:
    """The fill experiment for one seed; the ``results.json`` dict (written to ``out_dir``).

    ``trace``: ``openb`` or ``openb:VARIANT``; ``cluster``: ``openb`` (the trace's nodes).
    ``pods``/``nodes`` replace both (tests use small synthetic ones).
    """
    from libs.sim.loaders.openb import load_fill_pods, load_nodes

    for name in policies:
        if name not in FILL_POLICIES:
            raise ValueError(f"unknown fill policy {name!r}; known: {', '.join(FILL_POLICIES)}")
    cfg = cfg or PolicyConfig.default()
    if pods is None or nodes is None:
        base, _, variant = trace.partition(":")
        if base != "openb" or cluster != "openb":
            raise ValueError("--fill needs --trace openb[:VARIANT] and --cluster openb")
        tdir = traces_dir or default_traces_dir()
        if not tdir.is_dir():
            raise FileNotFoundError(f"traces folder not found: {tdir}; pass --traces-dir")
        pods, _qos = load_fill_pods(tdir, variant=variant or "default")
        nodes, _ = load_nodes(tdir)
    capacity = float(sum(n.gpu_count for n in nodes))
    order = arrivals(pods, capacity, fill, seed)
    results: dict[str, Any] = {
        "experiment": "fill",
        "trace": trace,
        "cluster": cluster,
        "gpus": int(capacity),
        "nodes": len(nodes),
        "seed": seed,
        "fill": fill,
        "pods_in_list": len(pods),
        "definition": "alloc_at_arrived[p]: allocated GPU share / GPUs when the arrived GPU "
        "request (placed or failed) first reaches p% of the GPUs",
        "overrides": dict(overrides or {}),
        "policies": {},
    }
    for name in policies:
        policy = make_fill_policy(name)
        cb = (lambda f, _n=name: progress(_n, f)) if progress is not None else None
        results["policies"][name] = fill_one(
            policy, nodes, order, fill=fill, seed=seed, cfg=cfg, progress=cb
        )
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def default_traces_dir() -> Path:
    from libs.sim.loaders import default_traces_dir as d

    return Path(d())
