"""Prometheus gauges mirroring each published telemetry sample, so Grafana and the GPU-hot alert
read the same numbers the thermal guard reads from NATS."""

from __future__ import annotations

from prometheus_client import Gauge

from proto.nodes import TelemetrySample

GPU_UTILIZATION = Gauge("mosaic_gpu_utilization", "GPU utilization, 0..1", ["node", "gpu"])
GPU_TEMPERATURE = Gauge("mosaic_gpu_temperature_celsius", "GPU temperature", ["node", "gpu"])
GPU_POWER = Gauge("mosaic_gpu_power_watts", "GPU board power", ["node", "gpu"])
GPU_MEMORY_USED = Gauge("mosaic_gpu_memory_used_bytes", "GPU memory in use", ["node", "gpu"])


def record(sample: TelemetrySample) -> None:
    for g in sample.gpus:
        labels = (sample.node, str(g.index))
        GPU_UTILIZATION.labels(*labels).set(g.util)
        GPU_TEMPERATURE.labels(*labels).set(g.temp_c)
        GPU_POWER.labels(*labels).set(g.power_w)
        GPU_MEMORY_USED.labels(*labels).set(g.mem_used_gb * 1e9)
