"""The learner's rows to and from their wire form (``proto.profiles``).

Why apart from the rule: the rule is arithmetic on estimates; this is only the mapping of a
``Learnt`` (NaN power: none observed) onto a ``ProfileRow`` (None), so that the profiler can
publish its state and a scheduler (or a restarted profiler) can take it back.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from libs.policy.profile_learning import Key, LearningConfig, Learnt, apply_learnt
from libs.policy.profiles import ProfileTable
from proto.profiles import ProfileRow


def _none(x: float) -> float | None:
    return None if math.isnan(x) else x


def _nan(x: float | None) -> float:
    return math.nan if x is None else float(x)


def to_rows(learnt: Mapping[Key, Learnt]) -> tuple[ProfileRow, ...]:
    return tuple(
        ProfileRow(
            model=m,
            workload_class=c,
            framework=fw,
            speed=v.speed,
            power_w=_none(v.power_w),
            samples=v.samples,
            seed=tuple((s, _none(p)) for s, p in v.seed),
        )
        for (m, c, fw), v in sorted(learnt.items())
    )


def from_rows(rows: Iterable[ProfileRow]) -> list[tuple[Key, Learnt]]:
    return [
        (
            (r.model, r.workload_class, r.framework),
            Learnt(r.speed, _nan(r.power_w), r.samples, tuple((s, _nan(p)) for s, p in r.seed)),
        )
        for r in rows
    ]


def table_from_rows(
    base: ProfileTable, rows: Iterable[ProfileRow], cfg: LearningConfig | None = None
) -> ProfileTable:
    """The table a scheduler uses: ``base`` with the counted pooled rows learnt."""
    return apply_learnt(base, dict(from_rows(rows)), cfg or LearningConfig())
