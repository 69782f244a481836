"""The independent lifecycle checker must catch what it claims to catch (else the e2e proof
that no node is over-allocated would prove nothing)."""

from __future__ import annotations

import msgspec

from proto.events import Completed, Placed, Submitted
from proto.jobs import JobSpec
from proto.nodes import NodeSpec
from tests.e2e.checker import check

T4 = NodeSpec(id="t4-0", gpu_model="t4", gpu_count=2, gpu_mem_gb=16, host_mem_gb=64, cpus=16,
              idle_power_w=10, max_power_w=70)  # fmt: skip


def _ev(e) -> tuple[str, bytes]:  # type: ignore[no-untyped-def]
    return (f"lifecycle.{e.job_id}", msgspec.json.encode(e))


def _job(jid: str, **kw) -> tuple[str, bytes]:  # type: ignore[no-untyped-def]
    return _ev(Submitted(job_id=jid, time=0, spec=JobSpec(id=jid, **kw)))


def test_sharing_within_limits_is_fine_and_release_frees() -> None:
    events = [
        _job("a", gpus=0.5, gpu_mem_gb=8, host_mem_gb=30),
        _job("b", gpus=0.5, gpu_mem_gb=8, host_mem_gb=30),
        _ev(Placed(job_id="a", time=1, node="t4-0", gpu_indices=(0,), gpu_share=0.5)),
        _ev(Placed(job_id="b", time=1, node="t4-0", gpu_indices=(0,), gpu_share=0.5)),
        _ev(Completed(job_id="a", time=2, node="t4-0")),
        _job("c", gpus=0.5, gpu_mem_gb=8, host_mem_gb=30),
        _ev(Placed(job_id="c", time=3, node="t4-0", gpu_indices=(0,), gpu_share=0.5)),
    ]
    r = check(events, [T4])
    assert r.violations == []
    assert r.submitted == {"a": 1, "b": 1, "c": 1} and r.terminal_state("a") == "completed"


def test_overbooking_and_wrong_memory_are_caught() -> None:
    events = [
        _job("a", gpus=1, gpu_mem_gb=10, host_mem_gb=40),
        _job("b", gpus=0.5, gpu_mem_gb=8, host_mem_gb=40),
        _job("big", gpus=1, gpu_mem_gb=40),
        _ev(Placed(job_id="a", time=1, node="t4-0", gpu_indices=(0,), gpu_share=1.0)),
        _ev(Placed(job_id="b", time=1, node="t4-0", gpu_indices=(0,), gpu_share=0.5)),
        _ev(Placed(job_id="big", time=1, node="t4-0", gpu_indices=(1,), gpu_share=1.0)),
        _ev(Placed(job_id="a", time=2, node="t4-0", gpu_indices=(1,), gpu_share=1.0)),
    ]
    text = "\n".join(check(events, [T4]).violations)
    assert "GPU 0 shares 1.5" in text
    assert "GPU 0 memory 18" in text
    assert "host memory 80" in text
    assert "40 GB per GPU on a 16 GB t4" in text
    assert "placed again" in text
