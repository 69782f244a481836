"""Scheduling policies the simulator compares, one file each, behind one ``Policy`` interface.

``make_policy(name)`` builds one by name; ``POLICIES`` lists the names. ``mosaic`` drives
``libs.policy.scheduler`` (the live placer's code); the others are baselines, each documented
in its own module with what it does and does not model.
"""

from __future__ import annotations

from typing import Any

from libs.sim.state import Policy

POLICIES: tuple[str, ...] = ("fifo", "drf", "tiresias", "gavel", "mosaic")


def make_policy(name: str, **kwargs: Any) -> Policy:
    """A fresh policy instance (policies keep per-run state: never share one between runs)."""
    key = name.strip().lower()
    if key == "fifo":
        from libs.sim.baselines.fifo import Fifo

        return Fifo()
    if key == "drf":
        from libs.sim.baselines.drf import Drf

        return Drf()
    if key == "tiresias":
        from libs.sim.baselines.tiresias import Tiresias

        return Tiresias()
    if key == "gavel":
        from libs.sim.baselines.gavel import Gavel

        return Gavel()
    if key == "mosaic":
        from libs.sim.baselines.mosaic import Mosaic

        return Mosaic(**kwargs)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")


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
