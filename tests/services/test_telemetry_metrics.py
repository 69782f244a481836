"""The Prometheus gauges mirror what telemetry publishes on NATS."""

from __future__ import annotations

from prometheus_client import REGISTRY

from proto.nodes import GpuSample, TelemetrySample
from services.telemetry import metrics


def test_record_sets_every_gpu_gauge() -> None:
    sample = TelemetrySample(
        node="t4-9",
        time=1.0,
        backend="sim",
        gpus=(
            GpuSample(index=0, util=0.75, mem_used_gb=3.0, temp_c=88.0, power_w=61.0),
            GpuSample(index=1, util=0.0, mem_used_gb=0.0, temp_c=35.0, power_w=10.0),
        ),
    )
    metrics.record(sample)

    def value(name: str, gpu: str) -> float | None:
        return REGISTRY.get_sample_value(name, {"node": "t4-9", "gpu": gpu})

    assert value("mosaic_gpu_utilization", "0") == 0.75
    assert value("mosaic_gpu_temperature_celsius", "0") == 88.0
    assert value("mosaic_gpu_power_watts", "1") == 10.0
    assert value("mosaic_gpu_memory_used_bytes", "0") == 3.0e9
