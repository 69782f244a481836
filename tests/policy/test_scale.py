"""Scaling inference services (libs.policy.stages.scale, scaling, core_scale; issue 16): the
count stays in range, a burst is answered at once and only once, a quiet service gives
capacity back only after its window, a noisy load does not flap, and the scheduler queues,
places and stops replicas as the orders say."""

from __future__ import annotations

import dataclasses
import itertools

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from libs.policy.config import PolicyConfig
from libs.policy.core import Scheduler
from libs.policy.inventory import demo_cluster
from libs.policy.profiles import ProfileTable
from libs.policy.scaling import Autoscaler
from libs.policy.stages.scale import ScaleMemory, replicas_for, scale_verdict
from libs.policy.types import PendingJob
from proto.inference import (
    InferenceService,
    LoadReport,
    replica_id,
    validate_report,
    validate_service,
)
from proto.jobs import JobSpec
from proto.validation import revalidate_spec

REPLICA = JobSpec(
    id="template",
    priority=8,
    gpus=1.0,
    gpu_mem_gb=10.0,
    host_mem_gb=8.0,
    cpus=2.0,
    kind="inference",
    workload_class="inference",
    latency_p99_ms=100.0,
    est_runtime_s=86_400.0,
)
SVC = InferenceService(id="chat", replica=REPLICA, rps_per_replica=100.0, max_replicas=6)


def _verdict(rps, serving, asked=None, memory=None, now=0.0, p99=None, svc=SVC):
    report = LoadReport(service=svc.id, time=now, rps=rps, p99_ms=p99)
    asked = serving if asked is None else asked
    memory = ScaleMemory() if memory is None else memory
    return scale_verdict(svc, report, serving=serving, asked=asked, memory=memory, now=now)


def test_a_burst_scales_up_at_once_to_what_keeps_each_replica_below_its_threshold():
    v = _verdict(rps=410.0, serving=2)  # 2.05 of capacity
    assert v.replicas == 6  # ceil(410 / 80) = 6, at the maximum
    assert v.reason.startswith("up:")
    assert _verdict(rps=250.0, serving=2).replicas == 4  # ceil(250 / 80)


def test_replicas_still_starting_count_so_a_burst_is_answered_once():
    first = _verdict(rps=250.0, serving=2)
    again = _verdict(rps=250.0, serving=2, asked=first.replicas, memory=first.memory, now=5.0)
    assert again.replicas == first.replicas
    assert again.reason.startswith("busy:")


def test_a_p99_above_target_adds_one_replica_even_when_the_rate_looks_fine():
    v = _verdict(rps=100.0, serving=2, p99=140.0)
    assert v.replicas == 3 and "p99" in v.reason
    # but not while the one it asked for is still starting
    assert _verdict(rps=100.0, serving=2, asked=3, p99=140.0).replicas == 3


def test_a_quiet_service_scales_down_only_after_its_window_and_to_the_middle_threshold():
    mem = ScaleMemory()
    v = _verdict(rps=100.0, serving=5, memory=mem, now=0.0)  # 0.2 of capacity
    assert v.replicas == 5 and v.reason.startswith("quiet:")
    v = _verdict(rps=100.0, serving=5, memory=v.memory, now=299.0)
    assert v.replicas == 5
    v = _verdict(rps=100.0, serving=5, memory=v.memory, now=300.0)
    assert v.replicas == 2  # ceil(100 / (100 x 0.65))
    assert v.reason.startswith("down:")


def test_a_scale_up_restarts_the_window_before_any_scale_down():
    up = _verdict(rps=300.0, serving=2, now=0.0)
    v = _verdict(rps=50.0, serving=up.replicas, memory=up.memory, now=10.0)
    v = _verdict(rps=50.0, serving=up.replicas, memory=v.memory, now=305.0)
    assert v.replicas == up.replicas  # quiet for 295 s only
    v = _verdict(rps=50.0, serving=up.replicas, memory=v.memory, now=310.0)
    assert v.replicas < up.replicas


def test_a_stale_report_moves_nothing_and_the_range_is_restored_without_one():
    report = LoadReport(service="chat", time=0.0, rps=1000.0)
    v = scale_verdict(SVC, report, serving=1, asked=1, memory=ScaleMemory(), now=61.0)
    assert v.replicas == 1 and "no recent" in v.reason
    none = scale_verdict(SVC, None, serving=0, asked=0, memory=ScaleMemory(), now=0.0)
    assert none.replicas == SVC.min_replicas


@given(
    rates=st.lists(st.floats(0.0, 2000.0), min_size=1, max_size=40),
    lo=st.integers(0, 3),
    extra=st.integers(0, 5),
)
def test_the_count_stays_in_range_and_never_flaps_within_a_window(rates, lo, extra):
    svc = msgspec.structs.replace(SVC, min_replicas=lo, max_replicas=lo + extra)
    mem, have, changes = ScaleMemory(), lo, []
    for t, rps in enumerate(rates):
        v = _verdict(rps=rps, serving=have, memory=mem, now=t * 10.0, svc=svc)
        assert lo <= v.replicas <= lo + extra
        if v.replicas != have:
            changes.append((t * 10.0, v.replicas - have))
        mem, have = v.memory, v.replicas
    # a scale-down never follows a scale-up within scale_down_after_s
    for (t0, d0), (t1, d1) in itertools.pairwise(changes):
        if d0 > 0 and d1 < 0:
            assert t1 - t0 >= svc.scale_down_after_s


def test_replicas_for_is_the_smallest_count_within_the_threshold():
    for rps in (0.0, 1.0, 79.0, 80.0, 81.0, 400.0):
        n = replicas_for(SVC, rps, 0.8)
        assert n == SVC.min_replicas or rps <= n * 80.0 + 1e-6 < rps + 80.0 + 1e-6


def test_bad_services_and_reports_are_refused_naming_the_field():
    bad = InferenceService(
        id="no spaces",
        replica=msgspec.structs.replace(REPLICA, kind="training", latency_p99_ms=None),
        rps_per_replica=0.0,
        min_replicas=4,
        max_replicas=2,
        scale_down_at=0.9,
    )
    fields = {e.field for e in validate_service(bad)}
    assert {"id", "replica.kind", "replica.latency_p99_ms", "rps_per_replica"} <= fields
    assert "max_replicas" in fields
    assert validate_service(SVC) == []
    assert {e.field for e in validate_report(LoadReport(service="x", time=0, rps=-1))} == {"rps"}
    spec = msgspec.structs.replace(REPLICA, id="r", service="chat", kind="training")
    assert "service" in {e.field for e in revalidate_spec(spec)}


def test_replica_ids_are_job_ids_named_by_the_instant_and_never_reused():
    ids = {replica_id("a" * 48, t, k) for t in (0.0, 1.0, 86_400.0 * 365 * 30) for k in range(3)}
    assert len(ids) == 9
    for rid in ids:
        spec = msgspec.structs.replace(REPLICA, id=rid, service="a" * 48)
        assert revalidate_spec(spec) == []


def _sched() -> Scheduler:
    cfg = dataclasses.replace(PolicyConfig.default(), power_saving=False)
    return Scheduler(demo_cluster(), cfg=cfg, profiles=ProfileTable.default(), now=0.0)


def _apply(s: Scheduler, now: float) -> list:
    """What a driver does at an instant: scale, queue the added replicas, tick, start."""
    orders = s.scale_step(now)
    for o in orders:
        for spec in o.add:
            s.queue_job(PendingJob(spec, enqueued_at=now))
        for rid in o.stop:
            s.cancel_job(rid, now)
    d = s.tick(now)
    for p in d.places:
        s.start_job(p.allocation.job_id, p.allocation, p.job.spec, now)
    return orders


def test_the_scheduler_adds_places_and_stops_replicas_as_the_orders_say():
    s = _sched()
    s.define_service(SVC)
    orders = _apply(s, 0.0)
    assert [len(o.add) for o in orders] == [1]  # brought to its minimum
    first = orders[0].add[0].id
    assert s.holds(first) is not None  # placed by the same instant's pass
    s.service_load(LoadReport(service="chat", time=10.0, rps=290.0))
    orders = _apply(s, 10.0)
    added = [spec.id for spec in orders[0].add]
    assert len(added) == 3 and orders[0].report_time == 10.0
    assert all(s.holds(r) is not None for r in added)
    assert _apply(s, 11.0) == []  # nothing new: no order
    s.service_load(LoadReport(service="chat", time=20.0, rps=10.0))
    assert _apply(s, 20.0) == []  # quiet, the window is running
    assert s.scale_next_s() == 320.0
    assert s.tick(21.0).next_tick_s is not None
    assert _apply(s, 320.0) == []  # the window ended, but on a stale report: a silent service
    s.service_load(LoadReport(service="chat", time=320.0, rps=10.0))  # is not an idle one
    orders = _apply(s, 320.0)
    assert orders[0].stop == tuple(reversed(added))  # the newest first
    assert [r for r in [first, *added] if s.holds(r) is not None] == [first]
    s.remove_service("chat")
    assert _apply(s, 321.0)[0].stop == (first,)
    assert s.holds(first) is None


def test_a_replica_that_ends_by_itself_is_replaced():
    s = _sched()
    scaler: Autoscaler = s.scaler
    s.define_service(SVC)
    first = _apply(s, 0.0)[0].add[0].id
    s.end_job(first, 5.0)
    assert scaler.replicas["chat"] == {}
    orders = _apply(s, 6.0)
    assert len(orders[0].add) == 1 and orders[0].add[0].id != first
