"""Sharing that respects interference (libs.policy.stages.share, issue 16): placements never
pack jobs whose modelled slowdown breaks a bound or a latency target, the compiled placement
with its masked input equals the definition, and a latency replica waits rather than share
with a job that would break its target."""

from __future__ import annotations

import dataclasses
import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.core import Scheduler
from libs.policy.interference import InterferenceModel
from libs.policy.placement import place, to_allocation
from libs.policy.profiles import ProfileTable
from libs.policy.stages import share as SH
from libs.policy.types import PendingJob, Placement, Refusal
from proto.jobs import WORKLOAD_CLASSES, JobSpec
from proto.ledger import Allocation
from proto.validation import revalidate_spec
from tests.policy.strategies import node_spec

P = ProfileTable.default()
M = InterferenceModel.default()
CFG = dataclasses.replace(PolicyConfig.default(), power_saving=False)


@st.composite
def fractions(draw, prefix: str = "f", max_jobs: int = 10) -> list[JobSpec]:
    out = []
    for i in range(draw(st.integers(1, max_jobs))):
        target = draw(st.sampled_from([None, None, 100.0]))
        solo = draw(st.sampled_from([None, 80.0, 95.0])) if target else None
        out.append(
            JobSpec(
                id=f"{prefix}{i}",
                gpus=draw(st.sampled_from([0.1, 0.2, 0.25, 0.3, 0.5])),
                gpu_mem_gb=2.0,
                host_mem_gb=1.0,
                cpus=1.0,
                workload_class=draw(st.sampled_from(WORKLOAD_CLASSES)),
                kind="inference" if target else "training",
                latency_p99_ms=target,
                solo_latency_p99_ms=solo,
            )
        )
    return out


def _view(gpus: list[int]) -> ClusterView:
    return ClusterView.build([node_spec(f"n{i}", g) for i, g in enumerate(gpus)])


def _bound_holds_everywhere(view: ClusterView, cfg: PolicyConfig) -> None:
    for slot, here in view.residents.items():
        specs = list(here.values())
        for k, s in enumerate(specs):
            others = [SH.class_of(o) for o in specs[:k] + specs[k + 1 :]]
            got = M.slowdown_among(SH.class_of(s), others)
            assert got <= SH.max_slowdown(s, cfg) + 1e-9, (slot, s, others, got)
            if s is not None and s.latency_p99_ms is not None and s.solo_latency_p99_ms:
                assert s.solo_latency_p99_ms * got <= s.latency_p99_ms + 1e-9


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.sampled_from([1, 2]), min_size=1, max_size=3),
    fractions(),
    st.sampled_from([1.0, 1.05, 1.1, 1.25, 1.5]),
)
def test_no_placement_packs_a_pair_past_its_bound_or_a_latency_target(
    gpus: list[int], specs: list[JobSpec], bound: float
) -> None:
    cfg = dataclasses.replace(CFG, share_max_slowdown=bound)
    view = _view(gpus)
    for spec in specs:
        res = place(spec, view, P, cfg)
        if isinstance(res, Placement):
            view.allocate(to_allocation(spec, res, 0.0))
        _bound_holds_everywhere(view, cfg)


def _filled(view: ClusterView, blocked) -> ClusterView:  # type: ignore[no-untyped-def]
    """A copy of ``view`` where every slot in ``blocked`` is taken (no memory, no spec)."""
    out = view.copy()
    for n, (i, j) in enumerate(blocked):
        free = float(out.gpu_free[i, j])
        if free > 0:
            out.allocate(
                Allocation(
                    job_id=f"fill{n}", node=out.node_ids[i], gpu_indices=(j,), gpu_share=free,
                    gpu_mem_gb=0.0, host_mem_gb=0.0, cpus=0.0, time=0.0,
                )
            )  # fmt: skip
    return out


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=3),
    fractions(prefix="r"),
    fractions(prefix="new", max_jobs=1),
    st.sampled_from([1.05, 1.1, 1.25]),
)
def test_the_masked_compiled_placement_equals_the_definition(
    gpus: list[int], residents: list[JobSpec], new: list[JobSpec], bound: float
) -> None:
    """place() with the rule == place() without it on a view where exactly the slots the
    definition (``slot_ok``) refuses are taken."""
    blind = dataclasses.replace(CFG, share_interference=False)
    view = _view(gpus)
    for spec in residents:  # packed blind: some slots hold pairs the rule would refuse
        res = place(spec, view, P, blind)
        if isinstance(res, Placement):
            view.allocate(to_allocation(spec, res, 0.0))
    (spec,) = new
    cfg = dataclasses.replace(CFG, share_max_slowdown=bound)
    ok = SH.slot_ok(spec, view, M, cfg)
    blocked = [(int(i), int(j)) for i, j in zip(*(~ok).nonzero(), strict=True)]
    got = place(spec, view, P, cfg)
    want = place(spec, _filled(view, blocked), P, blind)
    if isinstance(want, Placement):
        assert isinstance(got, Placement)
        assert (got.node_id, got.gpu_indices, got.score) == (
            want.node_id, want.gpu_indices, want.score,
        )  # fmt: skip
        assert ok[got.node_index, got.gpu_indices[0]]
    else:
        assert isinstance(got, Refusal)
        assert got.reason in (want.reason, SH.INTERFERENCE)


def test_a_latency_replica_is_never_packed_beside_a_job_that_breaks_its_target() -> None:
    """One GPU holds an RNN fraction. An RNN replica with a 100 ms target that does 90 ms alone
    (headroom 1.11x) would run 1.28x slower beside it (the measured rnn|rnn pair): it waits
    (reason Interference) and starts once the GPU's RNN leaves; blind sharing packs it."""
    assert M.slowdown("rnn", "rnn") * 90.0 > 100.0
    replica = JobSpec(
        id="serve", gpus=0.5, gpu_mem_gb=2.0, workload_class="rnn", kind="inference",
        latency_p99_ms=100.0, solo_latency_p99_ms=90.0,
    )  # fmt: skip
    trainer = JobSpec(id="train", gpus=0.5, gpu_mem_gb=2.0, workload_class="rnn")
    for cfg, packed in ((CFG, False), (dataclasses.replace(CFG, share_interference=False), True)):
        s = Scheduler([node_spec("n0", 1)], cfg=cfg, profiles=P, now=0.0)
        s.queue_job(PendingJob(trainer, 0.0))
        assert len(s.schedule_pass(0.0)) == 1
        s.queue_job(PendingJob(replica, 1.0))
        placed = s.schedule_pass(1.0)
        assert bool(placed) is packed
        if not packed:
            assert s.reason_of("serve") == SH.INTERFERENCE
            s.end_job("train", 2.0)
            (p,) = s.schedule_pass(2.0)
            assert p.allocation.job_id == "serve"


def test_without_solo_latency_the_conservative_bound_applies() -> None:
    cfg = CFG
    blind = JobSpec(id="x", gpus=0.5, latency_p99_ms=100.0)
    known = JobSpec(id="y", gpus=0.5, latency_p99_ms=100.0, solo_latency_p99_ms=50.0)
    plain = JobSpec(id="z", gpus=0.5)
    assert SH.max_slowdown(blind, cfg) == cfg.share_latency_unknown_max_slowdown
    assert SH.max_slowdown(known, cfg) == cfg.share_max_slowdown  # 2x headroom: the bound rules
    assert SH.max_slowdown(plain, cfg) == cfg.share_max_slowdown
    assert SH.max_slowdown(None, cfg) == cfg.share_max_slowdown  # a resident without its spec


@pytest.mark.parametrize(
    ("target", "solo", "bad"),
    [
        (100.0, 90.0, set()),
        (100.0, None, set()),
        (None, None, set()),
        (0.0, None, {"latency_p99_ms"}),
        (math.nan, None, {"latency_p99_ms"}),
        (100.0, -1.0, {"solo_latency_p99_ms"}),
        (100.0, 150.0, {"solo_latency_p99_ms"}),  # slower alone than its target
        (math.inf, None, {"latency_p99_ms"}),
    ],
)
def test_latency_fields_are_validated(target: float | None, solo: float | None, bad: set) -> None:
    spec = JobSpec(id="j", gpus=0.5, latency_p99_ms=target, solo_latency_p99_ms=solo)
    assert {e.field for e in revalidate_spec(spec)} == bad


def test_an_interference_refusal_explains_itself_per_node() -> None:
    view = _view([1])
    trainer = JobSpec(id="train", gpus=0.5, gpu_mem_gb=2.0, workload_class="rnn")
    view.allocate(to_allocation(trainer, place(trainer, view, P, CFG), 0.0))  # type: ignore[arg-type]
    replica = JobSpec(
        id="serve", gpus=0.5, gpu_mem_gb=2.0, workload_class="rnn",
        latency_p99_ms=100.0, solo_latency_p99_ms=90.0,
    )  # fmt: skip
    res = place(replica, view, P, CFG, explain=True)
    assert isinstance(res, Refusal) and res.reason == SH.INTERFERENCE and not res.never_fits
    assert res.per_node == {"n0": "GPU 0: Interference: beside rnn it would run 1.277x > 1.111x"}
    # the other side: a CNN trainer (itself fine at 1.14x) may not join a replica it would
    # push past its target (95 ms alone, 100 ms target: 1.053x; rnn beside cnn: 1.054x)
    tight = msgspec.structs.replace(replica, solo_latency_p99_ms=95.0)
    cnn = msgspec.structs.replace(trainer, workload_class="cnn")
    view = _view([1])
    view.allocate(to_allocation(tight, place(tight, view, P, CFG), 0.0))  # type: ignore[arg-type]
    res = place(cnn, view, P, CFG, explain=True)
    assert isinstance(res, Refusal)
    assert res.per_node == {"n0": "GPU 0: Interference: serve (rnn) would run 1.054x > 1.053x"}


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.sampled_from([1, 2]), min_size=1, max_size=2),
    fractions(max_jobs=12),
    st.lists(st.integers(0, 11), max_size=8),
)
def test_through_the_scheduler_no_gpu_ever_holds_a_pair_past_its_bound(
    gpus: list[int], specs: list[JobSpec], ends: list[int]
) -> None:
    """Arrivals, passes and ends through the one scheduler both drivers feed: after every
    pass, every shared GPU satisfies every resident's bound and latency target."""
    s = Scheduler([node_spec(f"n{i}", g) for i, g in enumerate(gpus)], cfg=CFG, profiles=P)
    running: list[str] = []
    for t, spec in enumerate(specs):
        s.queue_job(PendingJob(spec, float(t)))
        running += [p.allocation.job_id for p in s.schedule_pass(float(t))]
        _bound_holds_everywhere(s.view, CFG)
        if t < len(ends) and running:
            s.end_job(running.pop(ends[t] % len(running)), float(t) + 0.5)
