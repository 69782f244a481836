"""The slow-GPU / energy guard computed for many queued jobs at once (``fast.codes.SlowCodes``,
compiled) says exactly what the rule says for each job on its own, written here plainly per job and
per GPU model as the specification (see ``PolicyConfig``: slow-GPU guard, energy guard, green
jobs)."""

from __future__ import annotations

import msgspec
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.policy import filters as F
from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.fast import codes as C
from libs.policy.fast import shapes
from libs.policy.placement import PlaceContext
from libs.policy.profiles import ProfileTable
from libs.policy.queue import PendingQueue, QueueArrays
from libs.policy.scores import CLASS_INDEX, green_tolerance, is_green
from libs.policy.types import PendingJob
from proto.jobs import HIGH_PRIORITY
from tests.policy.strategies import jobs, nodes

P = ProfileTable.default()
DAY_S = 86400.0


def rule(job: PendingJob, view: ClusterView, ctx: PlaceContext, cfg: PolicyConfig, now: float):
    """Models (bool per model of the view) this job may not start on now; the spec."""
    spec = job.spec
    if spec.est_runtime_s < cfg.slow_guard_runtime_s:
        return [False] * len(view.models)
    if spec.priority >= HIGH_PRIORITY and not cfg.guard_holds_high:
        return [False] * len(view.models)
    cls_i = CLASS_INDEX.get(spec.workload_class, CLASS_INDEX["other"])
    speed = ctx.tables.speed[:, cls_i].tolist()
    epw = ctx.tables.energy_per_work[:, cls_i].tolist()
    present = sorted(set(view.model_idx[F.static_mask(spec, view)].tolist()))
    if not present:
        return [False] * len(view.models)
    fast = max(present, key=lambda m: speed[m])
    greenest = min(epw[m] for m in present)
    best, e_fast = speed[fast], epw[fast]
    rem = spec.est_runtime_s * max(0.0, 1.0 - job.progress)
    waited = now - job.enqueued_at
    green, tol = is_green(spec, cfg), green_tolerance(spec)
    out = []
    for sp, e in zip(speed, epw, strict=True):
        loss = rem / sp - rem / best
        worth = 1.0 - e / e_fast >= (1.0 - cfg.green_worth * tol) * (1.0 - sp / best)
        if (sp < cfg.slow_guard_min_speed * best or (sp < best and e > e_fast)) and not worth:
            hold = cfg.energy_guard_factor * loss > waited
        elif sp < cfg.slow_guard_min_speed * best:
            hold = not green and loss > waited
        else:
            hold = False
        hungry = green and waited < cfg.green_wait_s
        out.append(hold or (hungry and e > cfg.green_energy_slack * greenest))
    return out


@st.composite
def queued(draw):
    specs = draw(jobs(max_jobs=10))
    out = []
    for s in specs:
        est = float(draw(st.sampled_from([60.0, 3600.0, 5 * 3600.0, 2 * DAY_S, 20 * DAY_S])))
        deadline = draw(st.sampled_from([None, None, 1e6]))
        s = msgspec.structs.replace(s, est_runtime_s=est, deadline=deadline)
        out.append(
            PendingJob(
                s,
                enqueued_at=float(draw(st.integers(0, 3 * 86400))),
                progress=draw(st.sampled_from([0.0, 0.0, 0.5])),
            )
        )
    return out


@settings(max_examples=150, deadline=None)
@given(nodes(), queued(), st.integers(0, 40 * 86400), st.booleans())
def test_vectorised_guard_matches_the_per_job_rule(node_list, pending, now, as_queue):
    view = ClusterView.build(node_list)
    cfg = PolicyConfig.default()
    ctx = PlaceContext.build(view, P, cfg)
    if as_queue:
        q = PendingQueue(pending)
        shape_of, _, specs = q.shapes()
        codes = C.SlowCodes(q, None, shape_of, specs, view, ctx, cfg, float(now))
    else:
        shape_of, _, specs = shapes.shapes_of(pending)
        qa = QueueArrays.from_jobs(pending)
        codes = C.SlowCodes(pending, qa, shape_of, specs, view, ctx, cfg, float(now))
    got = codes.rows(np.arange(len(pending)))
    for i, job in enumerate(pending):
        want = sum(1 << m for m, held in enumerate(rule(job, view, ctx, cfg, float(now))) if held)
        assert int(got[i]) == want, job.spec
        assert codes.row(i) == want


@settings(max_examples=100, deadline=None)
@given(nodes(), queued(), st.lists(st.integers(0, 40 * 86400), min_size=2, max_size=6))
def test_codes_kept_across_passes_match_the_rule_at_every_time(node_list, pending, times):
    """A queue keeps each row's code between passes (the ``slow_code`` column): passes at
    later, or earlier, times still give the per-job rule's answer at their own time."""
    view = ClusterView.build(node_list)
    cfg = PolicyConfig.default()
    ctx = PlaceContext.build(view, P, cfg)
    q = PendingQueue(pending)
    shape_of, _, specs = q.shapes()
    rows = np.arange(len(pending))
    for now in [*sorted(times), *times]:
        codes = C.SlowCodes(q, None, shape_of, specs, view, ctx, cfg, float(now))
        got = codes.rows(rows)
        for i, job in enumerate(pending):
            want = sum(1 << m for m, h in enumerate(rule(job, view, ctx, cfg, float(now))) if h)
            assert int(got[i]) == want, (job.spec, now)
