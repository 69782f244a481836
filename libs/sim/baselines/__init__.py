"""Scheduling policies the simulator compares, one file each, behind one ``Policy`` interface.

``make_policy(name)`` builds one by name; ``POLICIES`` lists the names. ``mosaic`` drives
``libs.policy.scheduler`` (the live placer's code); the others are baselines, each documented
in its own module with what it does and does not model.

Preemption: every policy that preempts does it through the engine's one mechanism
(``libs.sim.moves``) and so pays the same checkpoint cost (``PreemptConfig.checkpoint_cost_s``,
``--set preempt.checkpoint_cost_s=0`` for Gavel's published zero-cost setting). Each such
policy has a twin with the suffix ``-np`` that never preempts: ``tiresias-np``, ``gavel-np``,
``gavel-fifo-np``, ``las-np``, ``mosaic-np`` (Mosaic with ``preempt.enabled=false`` and
``preempt.burst_enabled=false``). ``fifo``
and ``drf`` never preempt (their papers' allocators do not).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from libs.sim.baselines.base import NO_PREEMPTION_SUFFIX
from libs.sim.state import Policy

PREEMPTIVE: tuple[str, ...] = ("tiresias", "gavel", "gavel-las", "gavel-fifo", "las", "mosaic")
POLICIES: tuple[str, ...] = (
    "fifo",
    "drf",
    *PREEMPTIVE,
    *(p + NO_PREEMPTION_SUFFIX for p in PREEMPTIVE),
)
GAVEL_KINDS = {
    "gavel": "max_min_perf",
    "gavel-las": "max_min_perf",
    "las": "max_min",
    "gavel-fifo": "fifo_perf",
}


def make_policy(name: str, **kwargs: Any) -> Policy:
    """A fresh policy instance (policies keep per-run state: never share one between runs).

    ``kwargs`` go to the policy's constructor (``drf``: ``weights``; ``mosaic``: ``cfg``)."""
    key = name.strip().lower()
    if key not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    preemptive = not key.endswith(NO_PREEMPTION_SUFFIX)
    base = key.removesuffix(NO_PREEMPTION_SUFFIX)
    if base == "fifo":
        from libs.sim.baselines.fifo import Fifo

        return Fifo()
    if base == "drf":
        from libs.sim.baselines.drf import Drf

        return Drf(**kwargs)
    if base == "tiresias":
        from libs.sim.baselines.tiresias import Tiresias

        return Tiresias(preemptive=preemptive, **kwargs)
    if base in GAVEL_KINDS:
        from libs.sim.baselines.gavel import Gavel

        p = Gavel(GAVEL_KINDS[base], preemptive=preemptive, **kwargs)
        p.name = key
        return p
    from libs.policy.config import MOVE_RULES, PolicyConfig
    from libs.sim.baselines.mosaic import Mosaic

    if preemptive:
        return Mosaic(**kwargs)
    cfg = kwargs.pop("cfg", None) or PolicyConfig.default()
    # every move rule off (``config.MOVE_RULES``): none preempts, so nothing is shrunk either
    off = dataclasses.replace(cfg.preempt, **dict.fromkeys(MOVE_RULES, False))
    cfg = dataclasses.replace(cfg, preempt=off)
    m = Mosaic(cfg, **kwargs)
    m.name = key
    return m


def parse_policies(text: str | list[str]) -> list[str]:
    """``"fifo,mosaic"`` -> ["fifo", "mosaic"], checked, duplicates refused."""
    names = text if isinstance(text, list) else [p for p in text.split(",")]
    out = [n.strip().lower() for n in names if n.strip()]
    if not out:
        raise ValueError(f"no policies given; known: {', '.join(POLICIES)}")
    for n in out:
        if n not in POLICIES:
            raise ValueError(f"unknown policy {n!r}; known: {', '.join(POLICIES)}")
    if len(set(out)) != len(out):
        raise ValueError(f"policy listed twice in {','.join(out)}")
    return out
