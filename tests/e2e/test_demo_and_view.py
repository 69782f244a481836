"""The demo workload's mix and the live view's rendering, without a stack."""

from __future__ import annotations

import random

from rich.console import Console

from libs.client.demo import DemoGenerator, jobs, make_job
from libs.client.live import Snapshot, final_summary, gpu_bar, render, summary_line
from libs.policy.inventory import demo_cluster
from proto.decisions import Decision
from proto.gpus import matches
from proto.jobs import HIGH_PRIORITY, JobSpec
from proto.nodes import GpuSample, TelemetrySample
from proto.validation import validate_job
from proto.views import JobView, NodeView

NOW = 1_800_000_000.0


def _fits_somewhere(spec: JobSpec) -> bool:
    for n in demo_cluster():
        if spec.constraints and not any(matches(c, n.gpu_model) for c in spec.constraints):
            continue
        gpu_ok = spec.gpu_mem_gb <= n.gpu_mem_gb and max(1, spec.gpus) <= n.gpu_count
        if gpu_ok and spec.host_mem_gb <= n.host_mem_gb and spec.cpus <= n.cpus:
            return True
    return False


def test_demo_mix_is_varied_valid_and_placeable() -> None:
    rng = random.Random(0)
    specs = [make_job(rng, f"d-{i}", NOW) for i in range(500)]
    models = [(n.gpu_model, n.gpu_mem_gb) for n in demo_cluster()]
    for s in specs:
        assert validate_job(s, now=NOW, cluster_models=models) == [], s
        assert _fits_somewhere(s), s
        assert 300 <= s.est_runtime_s <= 3600
    assert {s.workload_class for s in specs} == {
        "cnn", "transformer", "rnn", "recommendation", "inference"
    }  # fmt: skip
    assert {s.gpus for s in specs} == {0.5, 1, 2, 4, 8}
    assert any(s.gpu_mem_gb > 32 for s in specs) and any(16 < s.gpu_mem_gb <= 32 for s in specs)
    assert any(s.priority >= HIGH_PRIORITY for s in specs)
    assert 0.1 < sum(s.deadline is not None for s in specs) / len(specs) < 0.7
    assert any(s.energy_sensitivity >= 0.6 for s in specs)
    assert any(s.elastic for s in specs) and any(s.checkpointable for s in specs)


def test_demo_is_reproducible_and_paced() -> None:
    a = [s for s, _ in zip(jobs(3, lambda: NOW), range(20), strict=False)]
    b = [s for s, _ in zip(jobs(3, lambda: NOW), range(20), strict=False)]
    assert a == b and a != [s for s, _ in zip(jobs(4, lambda: NOW), range(20), strict=False)]
    sent: list[JobSpec] = []
    gen = DemoGenerator(sent.append, now=lambda: NOW, rate_per_s=1000)
    assert gen.step() >= 1 and gen.submitted == len(sent)


def _views() -> tuple[list[JobView], list[NodeView]]:
    nodes = demo_cluster()[:2]
    spec = JobSpec(id="j1", gpus=2)
    jobs_ = [
        JobView(id="j1", tenant="t", state="running", priority=5, gpus=2, spec=spec,
                submit_time=NOW, start_time=NOW + 120),
        JobView(id="j2", tenant="t", state="completed", priority=5, gpus=2, spec=spec,
                submit_time=NOW, start_time=NOW + 60, end_time=NOW + 600),
        JobView(id="j3", tenant="t", state="pending", priority=5, gpus=2, spec=spec),
    ]  # fmt: skip
    sample = TelemetrySample(
        node=nodes[0].id, time=NOW, backend="sim",
        gpus=tuple(GpuSample(index=i, util=0.5, mem_used_gb=1, temp_c=60 + i, power_w=100)
                   for i in range(8)),
    )  # fmt: skip
    views = [
        NodeView(spec=nodes[0], gpus_allocated=2.5, gpu_mem_allocated_gb=20,
                 host_mem_allocated_gb=32, jobs=("j1",), telemetry=sample),
        NodeView(spec=nodes[1], gpus_allocated=0, gpu_mem_allocated_gb=0, host_mem_allocated_gb=0),
    ]  # fmt: skip
    return jobs_, views


def test_summary_line_and_final_summary() -> None:
    jobs_, views = _views()
    snap = Snapshot(jobs=jobs_, nodes=views, elapsed_s=12, submitted_by_demo=3)
    line = summary_line(snap)
    for part in ("pending=1", "running=1", "completed=1", "failed=0", "gpus_busy=2.5/16"):
        assert part in line
    assert "mean_wait=1.5m" in line  # (120 s + 60 s) / 2 in Mosaic minutes
    assert "jobs submitted  3" in final_summary(snap)


def test_live_view_renders_nodes_bars_and_decisions() -> None:
    jobs_, views = _views()
    snap = Snapshot(
        jobs=jobs_, nodes=views, elapsed_s=3,
        decisions=[Decision(job_id="j1", time=NOW, action="place", service="placer",
                            node="a100-0", reason="best fit")],
    )  # fmt: skip
    console = Console(record=True, width=140)
    console.print(render(snap, "Mosaic test"))
    text = console.export_text()
    assert "a100-0" in text and "a100-1" in text and "best fit" in text
    assert "67°C" in text and "800W" in text
    assert gpu_bar(2.5, 8).plain == "██▌·····"
