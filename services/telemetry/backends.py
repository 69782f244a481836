"""Where GPU readings come from: a simulated model of the node, or NVML on a real machine.

The backend is always chosen explicitly. ``NvmlGpuBackend`` on a machine without a driver raises
``NvmlUnavailable`` with the reason; it never falls back to simulated numbers, because a
scheduler that believes made-up temperatures is worse than one that stops.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from libs.policy.thermal_model import UTIL_PER_SHARE, ThermalModel, gpu_power_w, heat_factor
from proto.gpus import CATALOG, canonical_model
from proto.ledger import Allocation, node_allocations
from proto.nodes import GpuSample, NodeSpec, TelemetrySample

GIB = 2**30


class GpuBackend(Protocol):
    name: str  # "sim" | "nvml": TelemetrySample.backend

    def node_specs(self) -> list[NodeSpec]: ...

    def sample(self, now: float) -> list[TelemetrySample]: ...


# --- simulated --------------------------------------------------------------------------------

MODEL = ThermalModel()  # libs.policy.thermal_model: the simulator's model too
AMBIENT_C = MODEL.ambient_c
IDLE_C = 35.0  # a datacenter GPU idles around here: where a fresh backend's GPUs start
NOMINAL_STEP_S = 5.0  # a sample whose clock did not move counts as one telemetry interval


@dataclass(frozen=True)
class HotSpot:
    """Pin ``gpu_index`` of ``node`` (None: of every hosted node) at ``temp_c``."""

    gpu_index: int
    temp_c: float
    node: str | None = None

    @classmethod
    def parse(cls, text: str) -> HotSpot:
        """``[NODE:]GPU_INDEX:TEMP``, e.g. ``a100-0:3:90`` or ``0:92.5``."""
        parts = text.split(":")
        try:
            if len(parts) == 2:
                return cls(int(parts[0]), float(parts[1]))
            if len(parts) == 3 and parts[0]:
                return cls(int(parts[1]), float(parts[2]), parts[0])
        except ValueError:
            pass
        raise ValueError(f"--hot {text!r}: expected [NODE:]GPU_INDEX:TEMP, e.g. 0:90")


class SimulatedGpuBackend:
    """GPU readings modelled from the allocations in the ledger.

    A GPU's load is the sum of the shares allocated on it; utilization is that load times a
    per-job efficiency near 0.9, power is idle + (max − idle) × utilization, and temperature
    follows ``libs.policy.thermal_model`` (first order toward a steady state set by power and
    the node's heat profile, its ``mosaic/heat`` label or ``heat``; cooling toward ambient
    when idle) over the Mosaic-clock time since the node's last sample. A call whose clock
    did not move (a test sampling in a loop, a stepped clock between steps) counts as one
    ``NOMINAL_STEP_S`` step, so every call is one reading. Deterministic for a given seed and
    sequence of calls. ``hot``: pinned readings (tests, demos); ``pin``/``unpin`` change them
    while the backend runs.
    """

    name = "sim"

    def __init__(
        self,
        nodes: list[NodeSpec],
        *,
        seed: int = 0,
        hot: Iterable[HotSpot] = (),
        heat: dict[str, float] | None = None,
        model: ThermalModel = MODEL,
    ) -> None:
        self.nodes = list(nodes)
        self.model = model
        self.hot: list[HotSpot] = []
        for h in hot:
            self.pin(h)
        # a bad mosaic/heat label is a start-up error naming the node, not a silent 1.0
        self.heat = {n.id: heat_factor(n, (heat or {}).get(n.id)) for n in self.nodes}
        self._rng = {n.id: np.random.default_rng([seed, _stable_hash(n.id)]) for n in self.nodes}
        self._temp_c = {n.id: np.full(n.gpu_count, IDLE_C) for n in self.nodes}
        self._last_s: dict[str, float] = {}
        self._load: dict[str, np.ndarray] = {}
        self._mem_gb: dict[str, np.ndarray] = {}
        self.asleep: set[str] = set()  # hosted nodes whose executor reports them asleep
        self.set_allocations(())

    def node_specs(self) -> list[NodeSpec]:
        return list(self.nodes)

    def pin(self, spot: HotSpot) -> None:
        """Pin a GPU's reading (replacing an earlier pin of the same GPU); ValueError naming
        the flag when the node or GPU is not hosted here."""
        ids = {n.id for n in self.nodes}
        if spot.node is not None and spot.node not in ids:
            raise ValueError(f"--hot names node {spot.node!r}, which this process does not host")
        for n in self.nodes:
            if (spot.node in (None, n.id)) and not 0 <= spot.gpu_index < n.gpu_count:
                raise ValueError(f"--hot GPU {spot.gpu_index} is not on {n.id} ({n.gpu_count})")
        self.unpin(spot.gpu_index, spot.node)
        self.hot.append(spot)

    def unpin(self, gpu_index: int, node: str | None = None) -> None:
        """Let a pinned GPU follow the model again (from its pinned temperature)."""
        self.hot = [h for h in self.hot if (h.gpu_index, h.node) != (gpu_index, node)]

    def _dt_s(self, node: str, now: float) -> float:
        last = self._last_s.get(node)
        self._last_s[node] = now if last is None else max(last, now)
        return now - last if last is not None and now > last else NOMINAL_STEP_S

    def set_allocations(self, allocations: Iterable[Allocation]) -> None:
        """Replace the allocation picture (the whole ledger; other nodes' entries are ignored)."""
        load = {n.id: np.zeros(n.gpu_count) for n in self.nodes}
        mem = {n.id: np.zeros(n.gpu_count) for n in self.nodes}
        for a in (p for entry in allocations for p in node_allocations(entry)):  # gang parts
            if a.node not in load:
                continue
            for i in a.gpu_indices:
                if 0 <= i < len(load[a.node]):
                    load[a.node][i] += a.gpu_share
                    mem[a.node][i] += a.gpu_mem_gb
        self._load = {k: np.minimum(v, 1.0) for k, v in load.items()}
        self._mem_gb = mem

    def set_asleep(self, node: str, asleep: bool) -> None:
        """Issue 13: an asleep node's GPUs are off (no load, no power, cooling to ambient)."""
        if asleep:
            self.asleep.add(node)
        else:
            self.asleep.discard(node)

    def sample(self, now: float) -> list[TelemetrySample]:
        return [
            self._asleep_sample(n, now) if n.id in self.asleep else self._sample_node(n, now)
            for n in self.nodes
        ]

    def _asleep_sample(self, node: NodeSpec, now: float) -> TelemetrySample:
        """Flagged ``asleep``, so no reader takes the cold, powerless GPUs for a fault."""
        temp = self.model.step(
            self._temp_c[node.id], 0.0, self._dt_s(node.id, now), max_power_w=node.max_power_w
        )
        self._temp_c[node.id] = temp
        gpus = tuple(
            GpuSample(
                index=i, util=0.0, mem_used_gb=0.0, temp_c=round(float(temp[i]), 2), power_w=0.0
            )
            for i in range(node.gpu_count)
        )
        return TelemetrySample(node=node.id, time=now, backend=self.name, gpus=gpus, asleep=True)

    def _sample_node(self, node: NodeSpec, now: float) -> TelemetrySample:
        rng = self._rng[node.id]
        load = self._load[node.id]
        busy = load > 0
        efficiency = np.clip(rng.normal(UTIL_PER_SHARE, 0.04, node.gpu_count), 0.6, 1.0)
        util = np.where(
            busy, load * efficiency, np.clip(rng.normal(0.0, 0.005, node.gpu_count), 0, 0.02)
        )
        power_w = gpu_power_w(node.idle_power_w, node.max_power_w, util)
        power_w = np.maximum(
            0.0, power_w + rng.normal(0.0, 0.01 * node.max_power_w, node.gpu_count)
        )
        temp = self.model.step(
            self._temp_c[node.id],
            power_w,
            self._dt_s(node.id, now),
            max_power_w=node.max_power_w,
            heat=self.heat[node.id],
        )
        self._temp_c[node.id] = temp  # the model's state; the reading adds sensor noise
        reading = np.maximum(temp + rng.normal(0.0, 0.3, node.gpu_count), AMBIENT_C)
        for h in self.hot:
            if h.node in (None, node.id):
                temp[h.gpu_index] = h.temp_c  # unpinned, it cools or heats from here
                reading[h.gpu_index] = h.temp_c + rng.normal(0.0, 0.2)
        mem_gb = np.minimum(self._mem_gb[node.id] + np.where(busy, 0.4, 0.0), node.gpu_mem_gb)
        gpus = tuple(
            GpuSample(
                index=i,
                util=round(float(util[i]), 4),
                mem_used_gb=round(float(mem_gb[i]), 3),
                temp_c=round(float(reading[i]), 2),
                power_w=round(float(power_w[i]), 2),
            )
            for i in range(node.gpu_count)
        )
        return TelemetrySample(node=node.id, time=now, backend=self.name, gpus=gpus)


def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


# --- NVML ---------------------------------------------------------------------------------------


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine (no library, no driver, no GPU); says why."""


def load_nvml() -> Any:
    """The pynvml module (package nvidia-ml-py), or NvmlUnavailable."""
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(
            f"--backend nvml needs the pynvml module (pip package nvidia-ml-py): {exc}"
        ) from None
    return pynvml


def node_id_from_host(hostname: str | None = None) -> str:
    """A subject-safe node id from the host name ("gpu-7.dc1" -> "gpu-7-dc1")."""
    host = (hostname or socket.gethostname()).lower()
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in host).strip("-") or "node"


def read_gpu_spec(nvml: Any, handle: Any) -> tuple[str, float, float]:
    """(canonical model, memory GiB, power limit W) of one device."""
    name = nvml.nvmlDeviceGetName(handle)
    if isinstance(name, bytes):
        name = name.decode()
    mem_gib = nvml.nvmlDeviceGetMemoryInfo(handle).total / GIB
    try:
        limit_w = nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
    except nvml.NVMLError:
        limit_w = 0.0
    return canonical_model(name), round(mem_gib, 1), limit_w


def build_node_spec(
    nvml: Any,
    handles: list[Any],
    *,
    node_id: str,
    host_mem_gb: float,
    cpus: int,
    labels: dict[str, str] | None = None,
) -> NodeSpec:
    """The NodeSpec of a machine from its NVML devices. Mixed GPU models on one node are
    refused: the scheduler's unit is a node of identical GPUs."""
    if not handles:
        raise NvmlUnavailable("NVML reports no GPU on this machine")
    specs = [read_gpu_spec(nvml, h) for h in handles]
    models = sorted({m for m, _, _ in specs})
    if len(models) > 1:
        raise NvmlUnavailable(f"mixed GPU models on one node are not supported: {models}")
    model = models[0]
    mem_gb = min(m for _, m, _ in specs)
    limit_w = max(w for _, _, w in specs)
    catalog = CATALOG.get(model)
    max_power_w = limit_w or (catalog.tdp_w if catalog else 0.0)
    idle_w = catalog.idle_w if catalog else round(0.15 * max_power_w, 1)
    return NodeSpec(
        id=node_id,
        gpu_model=model,
        gpu_count=len(handles),
        gpu_mem_gb=mem_gb,
        host_mem_gb=host_mem_gb,
        cpus=cpus,
        idle_power_w=idle_w,
        max_power_w=max_power_w,
        labels={"telemetry": "nvml", **(labels or {})},
    )


def read_gpu_sample(nvml: Any, handle: Any, index: int) -> GpuSample:
    mem = nvml.nvmlDeviceGetMemoryInfo(handle)
    util = nvml.nvmlDeviceGetUtilizationRates(handle)
    temp_c = nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
    power_w = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
    return GpuSample(
        index=index,
        util=util.gpu / 100.0,
        mem_used_gb=round(mem.used / GIB, 3),
        temp_c=float(temp_c),
        power_w=round(power_w, 2),
    )


def _host_mem_gb() -> float:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB, 1)
    except (ValueError, OSError):
        return 0.0


class NvmlGpuBackend:
    """The real GPUs of this machine, read through NVML."""

    name = "nvml"

    def __init__(self, node_id: str | None = None, *, nvml: Any = None) -> None:
        self.nvml = nvml if nvml is not None else load_nvml()
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as exc:
            raise NvmlUnavailable(
                f"--backend nvml: NVML could not start ({exc}); is an NVIDIA driver installed "
                "and a GPU visible? Use --backend sim for a simulated node."
            ) from None
        try:
            count = self.nvml.nvmlDeviceGetCount()
            self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self.spec = build_node_spec(
                self.nvml,
                self.handles,
                node_id=node_id or node_id_from_host(),
                host_mem_gb=_host_mem_gb(),
                cpus=os.cpu_count() or 1,
            )
        except self.nvml.NVMLError as exc:
            self.close()
            raise NvmlUnavailable(f"--backend nvml: reading the GPUs failed: {exc}") from None
        except NvmlUnavailable:
            self.close()
            raise

    def node_specs(self) -> list[NodeSpec]:
        return [self.spec]

    def sample(self, now: float) -> list[TelemetrySample]:
        gpus = tuple(read_gpu_sample(self.nvml, h, i) for i, h in enumerate(self.handles))
        return [TelemetrySample(node=self.spec.id, time=now, backend=self.name, gpus=gpus)]

    def close(self) -> None:
        # shutting down a half-started NVML: nothing more to do if it fails
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()
