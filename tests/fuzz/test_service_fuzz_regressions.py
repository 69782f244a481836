"""What the service fuzzer found, one regression each, without a server (the fuzzer itself,
test_service_fuzz.py, runs them end to end): the record validators, and the loops that raised
on every round once one unsound record was in a bucket."""

from __future__ import annotations

import math

import msgspec

from libs.policy.config import PolicyConfig
from libs.policy.profiles import ProfileTable
from libs.policy.types import PendingJob
from proto.jobs import CancelRequest, JobSpec
from proto.ledger import Allocation
from proto.nodes import ExecutorReport, GpuSample, RunningAttempt, TelemetrySample
from proto.validation_records import (
    revalidate_allocation,
    revalidate_node_spec,
    revalidate_report,
    revalidate_sample,
    sound_attempt,
)
from services.gateway.nodes_view import NodesModel
from services.placer.cancels import _errors as cancel_errors
from services.scorer.admission import admission_scores
from tests.services.test_placer import small_cluster

NOW = 1.7e9
NODES = small_cluster()
V100 = NODES[0]


def _alloc(**changes: object) -> Allocation:
    a = Allocation(
        job_id="j1",
        node=V100.id,
        gpu_indices=(0,),
        gpu_share=1.0,
        gpu_mem_gb=8.0,
        host_mem_gb=8.0,
        cpus=2.0,
        time=NOW,
    )
    return msgspec.structs.replace(a, **changes)


def test_real_records_are_sound() -> None:
    for n in NODES:
        assert revalidate_node_spec(n, n.id) == []
    assert revalidate_allocation(_alloc(), V100, key="j1") == []
    gpu = GpuSample(index=3, util=0.5, mem_used_gb=4.0, temp_c=60.0, power_w=200.0)
    assert (
        revalidate_sample(TelemetrySample(node=V100.id, time=NOW, backend="sim", gpus=(gpu,)), V100)
        == []
    )
    report = ExecutorReport(
        node=V100.id,
        time=NOW,
        boot_id="b",
        interval_s=5.0,
        running=(RunningAttempt(job_id="j1", attempt=2),),
    )
    assert revalidate_report(report) == []


def test_hostile_node_specs_are_refused() -> None:
    """A node of 10^9 GPUs made the gateway's dashboard answer 500 (MemoryError) and would
    have the placer build arrays of that size; gpu_count 0, infinite memory, a key that is not
    its id are no nodes either."""
    for changes in (
        {"gpu_count": 10**9},
        {"gpu_count": 0},
        {"gpu_mem_gb": math.inf},
        {"host_mem_gb": -1.0},
        {"cpus": 2**63},
        {"idle_power_w": 500.0},  # above its max
        {"id": "a b"},
        {"labels": {"x" * 300: ""}},
    ):
        spec = msgspec.structs.replace(V100, **changes)
        assert revalidate_node_spec(spec, V100.id if "id" not in changes else "a b"), changes
    assert revalidate_node_spec(V100, "another-key")


def test_hostile_allocations_samples_reports_are_refused() -> None:
    for changes in (
        {"gpu_indices": (99,)},
        {"gpu_indices": (0, 0)},
        {"gpu_indices": ()},
        {"gpu_share": 1e-320},
        {"gpu_mem_gb": math.inf},  # the sim telemetry's samples became undecodable (null)
        {"attempt": 2**63},
        {"time": math.inf},
        {"spec": JobSpec(id="other")},
    ):
        assert revalidate_allocation(_alloc(**changes), V100, key="j1"), changes
    assert revalidate_allocation(_alloc(), V100, key="j2")
    many = tuple(
        GpuSample(index=i, util=0, mem_used_gb=0, temp_c=-5, power_w=0) for i in range(10_000)
    )
    cold = (GpuSample(index=0, util=0.1, mem_used_gb=1, temp_c=-300, power_w=10),)
    for gpus in (many, cold):
        assert revalidate_sample(
            TelemetrySample(node=V100.id, time=NOW, backend="sim", gpus=gpus), V100
        )
    for interval in (0.0, -1.0, math.inf, 1e308):
        assert revalidate_report(
            ExecutorReport(node="n", time=NOW, boot_id="b", interval_s=interval)
        )
    assert not sound_attempt(0) and not sound_attempt(2**64 - 1) and sound_attempt(1)


def test_the_scorer_scores_with_an_allocation_that_does_not_fit_its_node() -> None:
    """GPU 99 of a 4-GPU node, or a GPU held twice, in the ledger made every ranking raise
    (``rank_failed``) and the queue froze; such an entry is now left out of the view, and the
    admission scores go out."""
    pending = [PendingJob(JobSpec(id="ok"), NOW)]
    bad = [_alloc(gpu_indices=(99,)), _alloc(job_id="j2"), _alloc(job_id="j3")]  # j3 twice on 0
    got = admission_scores(
        pending, NODES, bad, now=NOW, cfg=PolicyConfig.default(), profiles=ProfileTable.default()
    )
    assert [a.job.spec.id for a in got.scores] == ["ok"]
    assert math.isfinite(got.scores[0].score) and 0 < got.load < 1  # j2 counted, once


def test_a_cancel_without_a_sound_job_id_is_refused() -> None:
    """``lifecycle.a b`` is no subject: the placer's Cancelled for it could not be published."""
    assert cancel_errors(CancelRequest(job_id="a b"))
    assert cancel_errors(CancelRequest(job_id=""))
    assert cancel_errors(CancelRequest(job_id="fz-1")) == []


def test_the_gateway_node_model_keeps_no_unsound_record() -> None:
    """A node of 10^9 GPUs made ``GET /`` answer 500 (MemoryError); it counts as absent now,
    and so do an allocation and a sample that do not fit the node."""
    told: list[str] = []
    model = NodesModel(refuse=lambda record, errors: bool(errors) and not told.append(record))
    model.put_spec(V100.id, V100)
    model.put_spec("huge", msgspec.structs.replace(V100, id="huge", gpu_count=10**9))
    model.put_allocation("j1", _alloc(gpu_indices=(99,)))
    cold = GpuSample(index=0, util=0.1, mem_used_gb=1, temp_c=-300, power_w=10)
    model.put_sample(TelemetrySample(node=V100.id, time=NOW, backend="sim", gpus=(cold,)))
    assert set(model.specs) == {V100.id} and not model.ledger and not model.samples
    assert told == ["node", "allocation", "telemetry"]
    model.put_allocation("j1", _alloc())
    assert [v.gpus_allocated for v in model.views()] == [1.0]
    # a sound sample dated in 2100 hid every real one after it (the 10,000-per-target run)
    ahead = TelemetrySample(node=V100.id, time=4.1e9, backend="sim", gpus=())
    model.put_sample(ahead, now=NOW)
    model.put_sample(TelemetrySample(node=V100.id, time=NOW, backend="sim", gpus=()), now=NOW)
    assert model.samples[V100.id].time == NOW and told[-1] == "telemetry"
