"""What ``mosaic profiles`` lists: each (GPU model, workload class) the scheduler knows, with the
speed and power it uses and where they came from, and the per-framework rows learnt beside it.

Why from the policy's own table: the listing must show what the scheduler decides with
(``profile_learning.apply_learnt`` over the shipped table, estimates for models that have no
measurement), not a second opinion. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from libs.policy.profile_learning import POOLED, LearningConfig, source_kind
from libs.policy.profile_wire import from_rows, table_from_rows
from libs.policy.profiles import ProfileTable
from proto.gpus import canonical_model
from proto.jobs import WORKLOAD_CLASSES
from proto.nodes import NodeSpec
from proto.profiles import ProfileRow, ProfileView


def listing(
    base: ProfileTable,
    rows: Iterable[ProfileRow],
    nodes: Iterable[NodeSpec] = (),
    cfg: LearningConfig | None = None,
) -> list[ProfileView]:
    """Every model of the table or the cluster x every class (framework ``*``: the row the
    scheduler uses), then each framework's learnt row, sorted by model, class, framework."""
    cfg = cfg or LearningConfig()
    rows = list(rows)
    table = table_from_rows(base, rows, cfg).covering(list(nodes))
    learnt = dict(from_rows(rows))
    models = set(table.models()) | {canonical_model(n.gpu_model) for n in nodes}
    out: list[ProfileView] = []
    for m in sorted(models):
        for c in WORKLOAD_CLASSES:
            e = table.entry(m, c)
            row = learnt.get((m, c, POOLED))
            kind, detail, n = source_kind(e), e.source, 0
            if row is not None:
                n = row.samples
                if not row.counts(cfg):  # observed, not yet enough to count
                    kind, detail = "learning", f"{n} of {cfg.min_samples} jobs; uses {kind}"
            out.append(_view(m, c, POOLED, e.speed, e.power_w, n, kind, detail))
    for (m, c, fw), row in sorted(learnt.items()):
        if fw == POOLED:
            continue
        power = table.power_w(m, c) if math.isnan(row.power_w) else row.power_w
        kind = "learnt" if row.counts(cfg) else "learning"
        detail = "this framework's jobs only"
        out.append(_view(m, c, fw, row.speed, power, row.samples, kind, detail))
    out.sort(key=lambda v: (v.model, v.workload_class, v.framework != POOLED, v.framework))
    return out


def _view(
    m: str, c: str, fw: str, speed: float, power_w: float, n: int, kind: str, detail: str
) -> ProfileView:
    return ProfileView(
        model=m,
        workload_class=c,
        framework=fw,
        speed=speed,
        power_w=power_w,
        samples=n,
        source=kind,
        detail=detail,
    )
