"""Telemetry: the simulated GPU model, the NVML conversion with a fake device, and the service
against a real nats-server."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest

from libs.bus import Bus, ServiceConfig, serve
from libs.clock import Clock
from proto import subjects
from proto.ledger import Allocation
from proto.nodes import NodeSpec, TelemetrySample
from services.telemetry.backends import (
    HotSpot,
    NvmlGpuBackend,
    NvmlUnavailable,
    SimulatedGpuBackend,
    build_node_spec,
    load_nvml,
    node_id_from_host,
    read_gpu_sample,
)
from services.telemetry.service import main

ROOT = Path(__file__).resolve().parents[2]
A100 = NodeSpec(
    id="a100-0",
    gpu_model="a100-80gb",
    gpu_count=4,
    gpu_mem_gb=80,
    host_mem_gb=512,
    cpus=64,
    idle_power_w=55,
    max_power_w=400,
)


def _alloc(job: str, gpus: tuple[int, ...], share: float = 1.0, node: str = "a100-0") -> Allocation:
    return Allocation(
        job_id=job,
        node=node,
        gpu_indices=gpus,
        gpu_share=share,
        gpu_mem_gb=30,
        host_mem_gb=8,
        cpus=4,
        time=0.0,
    )


# --- simulated backend ------------------------------------------------------------------------


def test_sim_busy_gpus_are_hotter_and_draw_more_power() -> None:
    sim = SimulatedGpuBackend([A100], seed=1)
    sim.set_allocations([_alloc("j1", (0, 1)), _alloc("other", (2,), node="t4-9")])
    for _ in range(10):  # let the temperatures settle
        (sample,) = sim.sample(now=1.0)
    g = sample.gpus
    assert sample.node == "a100-0" and sample.backend == "sim" and len(g) == 4
    for busy in (0, 1):
        for idle in (2, 3):
            assert g[busy].util > 0.5 > g[idle].util
            assert g[busy].power_w > 250 > 80 > g[idle].power_w
            assert g[busy].temp_c > g[idle].temp_c + 20
    assert g[0].mem_used_gb >= 30 and g[2].mem_used_gb == 0


def test_sim_fractional_share_is_half_as_busy() -> None:
    sim = SimulatedGpuBackend([A100], seed=2)
    sim.set_allocations([_alloc("half", (0,), share=0.5), _alloc("full", (1,))])
    (sample,) = sim.sample(now=1.0)
    assert 0.3 < sample.gpus[0].util < 0.6 < sample.gpus[1].util


def test_sim_is_deterministic_per_seed() -> None:
    def run(seed: int) -> list[TelemetrySample]:
        sim = SimulatedGpuBackend([A100], seed=seed)
        sim.set_allocations([_alloc("j", (0,))])
        return [s for _ in range(3) for s in sim.sample(now=5.0)]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_sim_hot_spot() -> None:
    sim = SimulatedGpuBackend([A100], seed=0, hot=[HotSpot.parse("2:90")])
    (sample,) = sim.sample(now=1.0)
    assert sample.gpus[2].temp_c == pytest.approx(90, abs=1.5)
    assert sample.gpus[0].temp_c < 50
    assert HotSpot.parse("a100-0:3:91.5") == HotSpot(3, 91.5, "a100-0")
    with pytest.raises(ValueError, match="GPU_INDEX:TEMP"):
        HotSpot.parse("hot")
    with pytest.raises(ValueError, match="not on a100-0"):
        SimulatedGpuBackend([A100], hot=[HotSpot(9, 90.0)])
    with pytest.raises(ValueError, match="does not host"):
        SimulatedGpuBackend([A100], hot=[HotSpot(0, 90.0, "t4-1")])


# --- NVML -------------------------------------------------------------------------------------


class FakeNvml:
    """Just the pynvml calls the backend makes, with a real machine's kind of answers."""

    NVML_TEMPERATURE_GPU = 0

    class NVMLError(Exception):
        pass

    def __init__(self, names: list[str], *, total_bytes: int = 81920 * 2**20) -> None:
        self.names = names
        self.total_bytes = total_bytes
        self.shutdown_calls = 0

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.names[h].encode()

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(total=self.total_bytes, used=(h + 1) * 2**30, free=0)

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return 400_000  # mW

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=37, memory=10)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 61 + h

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 123_456  # mW


def test_nvml_node_spec_and_sample_from_fake_devices() -> None:
    nvml = FakeNvml(["NVIDIA A100-SXM4-80GB"] * 2)
    backend = NvmlGpuBackend("gpu-7", nvml=nvml)
    (spec,) = backend.node_specs()
    assert spec.id == "gpu-7" and spec.gpu_model == "a100-80gb" and spec.gpu_count == 2
    assert spec.gpu_mem_gb == 80.0 and spec.max_power_w == 400.0 and spec.idle_power_w == 55
    (sample,) = backend.sample(now=3.0)
    assert sample.backend == "nvml" and sample.time == 3.0
    g1 = sample.gpus[1]
    assert (g1.index, g1.util, g1.mem_used_gb, g1.temp_c, g1.power_w) == (
        1,
        0.37,
        2.0,
        62.0,
        123.46,
    )
    backend.close()
    assert nvml.shutdown_calls == 1


def test_nvml_unknown_model_and_mixed_models() -> None:
    nvml = FakeNvml(["NVIDIA B300"])
    spec = build_node_spec(nvml, [0], node_id="n", host_mem_gb=1, cpus=1)
    assert spec.gpu_model == "b300" and spec.idle_power_w == pytest.approx(60.0)
    mixed = FakeNvml(["Tesla T4", "NVIDIA A100-SXM4-80GB"])
    with pytest.raises(NvmlUnavailable, match="mixed GPU models"):
        build_node_spec(mixed, [0, 1], node_id="n", host_mem_gb=1, cpus=1)
    with pytest.raises(NvmlUnavailable, match="no GPU"):
        build_node_spec(nvml, [], node_id="n", host_mem_gb=1, cpus=1)
    assert read_gpu_sample(nvml, 0, 0).temp_c == 61.0


def test_nvml_without_pynvml_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(NvmlUnavailable, match="nvidia-ml-py"):
        load_nvml()


def test_nvml_without_driver_is_a_clear_error() -> None:
    pytest.importorskip("pynvml")
    try:
        backend = NvmlGpuBackend("x")
    except NvmlUnavailable as exc:
        assert "NVML" in str(exc) and "--backend sim" in str(exc)
    else:  # a machine with a driver: then it must have read real GPUs
        assert backend.node_specs()[0].gpu_count >= 1
        backend.close()


def test_nvml_cli_exits_nonzero_without_driver() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "services.telemetry", "--backend", "nvml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        input="",
    )
    if proc.returncode == 0:
        pytest.skip("this machine has an NVIDIA driver")
    assert proc.returncode == 2
    assert "NVML" in proc.stderr and "sim" in proc.stderr


def test_node_id_from_host() -> None:
    assert node_id_from_host("GPU-7.dc1.example") == "gpu-7-dc1-example"


# --- the service ------------------------------------------------------------------------------


async def test_sim_service_registers_node_and_publishes_samples(nats_url: str) -> None:
    bus = await Bus.connect(nats_url, "test")
    await bus.ensure_topology()
    samples: list[TelemetrySample] = []

    async def on_sample(s: TelemetrySample) -> None:
        samples.append(s)

    await bus.subscribe(subjects.TELEMETRY_ALL, TelemetrySample, on_sample)
    ledger = await bus.kv(subjects.KV_LEDGER, Allocation)
    await ledger.put("busy", _alloc("busy", (0, 1)))

    stop = asyncio.Event()
    t4 = msgspec.structs.replace(
        A100, id="t4-0", gpu_model="t4", gpu_mem_gb=16, max_power_w=70, idle_power_w=10
    )
    args = argparse.Namespace(
        backend="sim",
        node_spec=[msgspec.json.encode([A100, t4]).decode()],
        node_id=None,
        interval_s=0.05,
        seed=3,
        hot=["t4-0:1:90"],
    )
    task = asyncio.create_task(
        serve(
            "telemetry",
            main,
            ServiceConfig(nats_url=nats_url),
            args=args,
            stop=stop,
            install_signals=False,
            clock=Clock(epoch=time.time(), factor=1.0),
        )
    )
    try:
        deadline = time.monotonic() + 10
        while not ({s.node for s in samples} == {"a100-0", "t4-0"} and len(samples) >= 20):
            assert time.monotonic() < deadline, f"samples: {len(samples)}"
            await asyncio.sleep(0.05)
        nodes = await (await bus.kv(subjects.KV_NODES, NodeSpec)).items()
        assert set(nodes) == {"a100-0", "t4-0"} and nodes["a100-0"].value == A100
        last_a100 = [s for s in samples if s.node == "a100-0"][-1]
        assert last_a100.gpus[0].util > 0.5 > last_a100.gpus[3].util  # follows the ledger
        last_t4 = [s for s in samples if s.node == "t4-0"][-1]
        assert last_t4.gpus[1].temp_c > 85

        await ledger.delete("busy")  # the job ended: the GPUs go idle
        deadline = time.monotonic() + 10
        while [s for s in samples if s.node == "a100-0"][-1].gpus[0].util > 0.1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 15) == 0
        await bus.close()


def test_sim_without_node_spec_is_a_usage_error() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "services.telemetry", "--backend", "sim"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 2 and "--node-spec" in proc.stderr
