"""Performance profiles: relative speed and active power per (GPU model, workload class).

Speed is throughput relative to the reference GPU (``REFERENCE_MODEL`` = 1.0) so that a job's
``est_runtime_s`` (given on the reference GPU) becomes ``est_runtime_s / speed`` on any model.
Measured entries come from the shipped ``data/profiles.json`` (written by
``libs/policy_io/derive_profiles.py`` from published benchmarks, each entry naming its source).
Any other model gets an *estimate* from datasheet ratios against the reference
(``proto.gpus.CATALOG``), or, for a model the catalog does not know, from the node's own
power/memory figures, or a conservative default; ``is_estimated`` says which. Nothing here
raises for an unknown model: a new GPU in the cluster must never stop scheduling.

Tables are immutable; ``observe`` returns a new table (exponential smoothing of measured speed),
so the profiler can publish versions without anyone seeing a half-updated table.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import numpy as np

from proto.gpus import CATALOG, GpuModelSpec, canonical_model
from proto.jobs import WORKLOAD_CLASSES, JobSpec
from proto.nodes import NodeSpec

REFERENCE_MODEL = "v100-32gb"
DATA_FILE = Path(__file__).with_name("data") / "profiles.json"

# Weights of compute vs memory bandwidth when estimating speed from datasheets, per class:
# convolutions are compute bound; recommendation and RNNs lean on memory bandwidth.
_COMPUTE_SHARE: Mapping[str, float] = MappingProxyType(
    {
        "cnn": 0.6,
        "transformer": 0.6,
        "rnn": 0.4,
        "recommendation": 0.3,
        "inference": 0.5,
        "other": 0.5,
    }
)
# Busy power as a share of TDP when nothing better is known (Zeus NSDI'23 medians, see data).
_DEFAULT_BUSY_FRACTION = 0.75
_UNKNOWN_SPEED = 0.5  # a GPU we know nothing about: assume half a V100 (conservative)
_UNKNOWN_TDP_W = 300.0


@dataclass(frozen=True, slots=True)
class ProfileEntry:
    speed: float
    power_w: float
    source: str
    estimated: bool = False


@dataclass(eq=False, slots=True)
class ProfileMemo:
    """A ``ProfileTable``'s derived lookups, one field per method that fills it."""

    entry: dict[tuple[str, str], ProfileEntry] = field(default_factory=dict)  # entry
    speed_matrix: dict[tuple, np.ndarray] = field(default_factory=dict)  # (models, classes)
    power_matrix: dict[tuple, np.ndarray] = field(default_factory=dict)  # (models, classes)
    best_speed: dict[tuple[str, ...], np.ndarray] = field(default_factory=dict)  # models
    covering: dict[tuple, ProfileTable] = field(default_factory=dict)  # node model shapes


@dataclass(frozen=True)
class ProfileTable:
    """Immutable map (model, class) -> ProfileEntry, plus idle power per model."""

    entries: Mapping[tuple[str, str], ProfileEntry]
    idle_w: Mapping[str, float] = field(default_factory=dict)
    reference_model: str = REFERENCE_MODEL
    # memo of derived lookups (the table itself never changes): not part of equality
    memo: ProfileMemo = field(default_factory=lambda: ProfileMemo(), compare=False, repr=False)

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def from_json(cls, data: str | bytes) -> ProfileTable:
        raw = json.loads(data)
        entries: dict[tuple[str, str], ProfileEntry] = {}
        for e in raw["entries"]:
            model, cls_ = canonical_model(e["model"]), e["class"]
            if cls_ not in WORKLOAD_CLASSES:
                raise ValueError(f"profiles: unknown workload class {cls_!r}")
            if not (e["speed"] > 0 and e["power_w"] > 0):
                raise ValueError(f"profiles: {model}/{cls_} needs speed > 0 and power_w > 0")
            entries[(model, cls_)] = ProfileEntry(
                float(e["speed"]), float(e["power_w"]), str(e["source"]), bool(e.get("estimated"))
            )
        idle = {canonical_model(k): float(v) for k, v in raw.get("idle_w", {}).items()}
        ref = raw.get("reference_model", REFERENCE_MODEL)
        return cls(MappingProxyType(entries), MappingProxyType(idle), ref)

    @classmethod
    def default(cls) -> ProfileTable:
        """The table shipped with the code (``data/profiles.json``)."""
        return cls.from_json(DATA_FILE.read_text())

    # --- lookups ------------------------------------------------------------------------------
    def entry(self, model: str, workload_class: str) -> ProfileEntry:
        key = (model, workload_class)
        hit = self.memo.entry.get(key)
        if hit is not None:
            return hit
        m = canonical_model(model)
        e = self.entries.get((m, workload_class))
        if e is None:
            e = self._estimate(m, workload_class, None)
        self.memo.entry[key] = e
        return e

    def speed(self, model: str, workload_class: str) -> float:
        return self.entry(model, workload_class).speed

    def power_w(self, model: str, workload_class: str) -> float:
        """Active (busy) power of one GPU running this class."""
        return self.entry(model, workload_class).power_w

    def idle_power_w(self, model: str) -> float:
        m = canonical_model(model)
        if m in self.idle_w:
            return self.idle_w[m]
        spec = CATALOG.get(m)
        return spec.idle_w if spec else 0.15 * _UNKNOWN_TDP_W

    def is_estimated(self, model: str, workload_class: str) -> bool:
        return self.entry(model, workload_class).estimated

    def source(self, model: str, workload_class: str) -> str:
        return self.entry(model, workload_class).source

    def runtime_s(self, spec: JobSpec, model: str) -> float:
        """Expected runtime of ``spec`` on ``model`` (its estimate is on the reference GPU)."""
        return spec.est_runtime_s / self.speed(model, spec.workload_class)

    def speed_matrix(self, models: Sequence[str], classes: Sequence[str]) -> np.ndarray:
        """float[len(models), len(classes)] of speeds, for vectorised scoring (read-only)."""
        key = (tuple(models), tuple(classes))
        hit = self.memo.speed_matrix.get(key)
        if hit is None:
            hit = np.array([[self.speed(m, c) for c in classes] for m in models], dtype=float)
            hit.setflags(write=False)
            self.memo.speed_matrix[key] = hit
        return hit

    def power_matrix(self, models: Sequence[str], classes: Sequence[str]) -> np.ndarray:
        key = (tuple(models), tuple(classes))
        hit = self.memo.power_matrix.get(key)
        if hit is None:
            hit = np.array([[self.power_w(m, c) for c in classes] for m in models], dtype=float)
            hit.setflags(write=False)
            self.memo.power_matrix[key] = hit
        return hit

    def best_speed(self, models: tuple[str, ...]) -> np.ndarray:
        """float[len(WORKLOAD_CLASSES)]: the fastest speed among ``models`` per class
        (read-only)."""
        hit = self.memo.best_speed.get(models)
        if hit is None:
            hit = self.speed_matrix(models, WORKLOAD_CLASSES).max(axis=0)
            hit.setflags(write=False)
            self.memo.best_speed[models] = hit
        return hit

    def models(self) -> list[str]:
        return sorted({m for m, _ in self.entries})

    # --- estimates ----------------------------------------------------------------------------
    def estimate_for(self, node: NodeSpec) -> ProfileTable:
        """A table that also covers ``node``'s model, estimated from the node's own figures when
        neither the table nor the catalog knows it. Returns ``self`` when nothing is missing."""
        m = canonical_model(node.gpu_model)
        missing = [c for c in WORKLOAD_CLASSES if (m, c) not in self.entries]
        if not missing:
            return self
        new = dict(self.entries)
        for c in missing:
            new[(m, c)] = self._estimate(m, c, node)
        idle = dict(self.idle_w)
        idle.setdefault(m, node.idle_power_w if node.idle_power_w > 0 else self.idle_power_w(m))
        return ProfileTable(MappingProxyType(new), MappingProxyType(idle), self.reference_model)

    def covering(self, nodes: Iterable[NodeSpec]) -> ProfileTable:
        """``estimate_for`` every node of a cluster (memoised per distinct node shape)."""
        shapes = {}
        for n in nodes:
            shapes.setdefault(n.gpu_model, n)
        key = tuple((n.gpu_model, n.max_power_w, n.idle_power_w) for n in shapes.values())
        hit = self.memo.covering.get(key)
        if hit is None:
            hit = self
            for n in shapes.values():
                hit = hit.estimate_for(n)
            self.memo.covering[key] = hit
        return hit

    def _estimate(self, model: str, cls_: str, node: NodeSpec | None) -> ProfileEntry:
        ref = CATALOG.get(self.reference_model)
        spec = CATALOG.get(model)
        ref_entry = self.entries.get((self.reference_model, cls_))
        ref_speed = ref_entry.speed if ref_entry else 1.0
        ref_power = ref_entry.power_w if ref_entry else (ref.tdp_w if ref else 300.0) * 0.75
        if spec is not None and ref is not None:
            # anchor on the measured model whose datasheet is nearest, if any, else the reference
            anchor_model, anchor = self._nearest_measured(spec, cls_)
            aspec = CATALOG[anchor_model] if anchor is not None else ref
            a_speed = anchor.speed if anchor is not None else ref_speed
            a_power = anchor.power_w if anchor is not None else ref_power
            ratio = _spec_ratio(spec, aspec, cls_)
            # same busy fraction of TDP as the anchor, kept within [idle, TDP] of this model
            power = _clamp_power(a_power * spec.tdp_w / aspec.tdp_w, spec.idle_w, spec.tdp_w)
            src = f"estimated: datasheet ratio to {anchor_model}"
            return ProfileEntry(a_speed * ratio, power, src, True)
        if node is not None and node.max_power_w > 0 and ref is not None:
            # unknown model: scale by board power (a proxy for compute), capped, never above 4x
            ratio = min(4.0, max(0.1, (node.max_power_w / ref.tdp_w) ** 0.8))
            power = _clamp_power(
                node.max_power_w * _DEFAULT_BUSY_FRACTION, node.idle_power_w, node.max_power_w
            )
            return ProfileEntry(
                ref_speed * ratio, power, "estimated: node max_power_w vs reference", True
            )
        return ProfileEntry(
            _UNKNOWN_SPEED * ref_speed,
            _UNKNOWN_TDP_W * _DEFAULT_BUSY_FRACTION,
            "estimated: unknown model, conservative default",
            True,
        )

    def _nearest_measured(self, spec: GpuModelSpec, cls_: str) -> tuple[str, ProfileEntry | None]:
        best: tuple[float, str, ProfileEntry | None] = (math.inf, self.reference_model, None)
        for (m, c), e in self.entries.items():
            if c != cls_ or m not in CATALOG or e.source.startswith("estimated: datasheet"):
                continue
            o = CATALOG[m]
            d = abs(math.log(max(spec.fp16_tflops, 1e-3) / max(o.fp16_tflops, 1e-3))) + abs(
                math.log(spec.mem_bw_gbps / o.mem_bw_gbps)
            )
            if d < best[0] or (d == best[0] and m < best[1]):
                best = (d, m, e)
        return best[1], best[2]

    # --- learning -----------------------------------------------------------------------------
    def observe(
        self, model: str, workload_class: str, measured_speed: float, alpha: float = 0.2
    ) -> ProfileTable:
        """A new table with speed smoothed towards ``measured_speed`` (EWMA weight ``alpha``)."""
        if not (measured_speed > 0 and math.isfinite(measured_speed)):
            raise ValueError(f"observe: measured_speed must be > 0, got {measured_speed}")
        if not 0.0 < alpha <= 1.0:
            raise ValueError("observe: alpha must be in (0, 1]")
        m = canonical_model(model)
        old = self.entry(m, workload_class)
        speed = (1 - alpha) * old.speed + alpha * measured_speed
        new = dict(self.entries)
        new[(m, workload_class)] = ProfileEntry(
            speed, old.power_w, f"observed (ewma {alpha:g}) over {old.source}", False
        )
        return ProfileTable(MappingProxyType(new), self.idle_w, self.reference_model)


def _clamp_power(power_w: float, idle_w: float, tdp_w: float) -> float:
    """Busy power never below idle (a running job adds load) nor above the board limit."""
    return min(max(power_w, idle_w), max(tdp_w, idle_w))


def _spec_ratio(spec: GpuModelSpec, ref: GpuModelSpec, cls_: str) -> float:
    """Throughput ratio spec/ref from datasheets: a weighted geometric mean of tensor compute
    (FP16, or FP32 when the GPU has no tensor cores) and memory bandwidth."""
    w = _COMPUTE_SHARE.get(cls_, 0.5)
    c1 = spec.fp16_tflops if spec.fp16_tflops > 0 else spec.fp32_tflops
    c0 = ref.fp16_tflops if ref.fp16_tflops > 0 else ref.fp32_tflops
    # tensor-core peak overstates real training gains: damp the compute ratio (sqrt)
    compute = math.sqrt(c1 / c0)
    bw = spec.mem_bw_gbps / ref.mem_bw_gbps
    return float(compute**w * bw ** (1 - w))
