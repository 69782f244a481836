"""The GPU vocabulary: canonical model names and the published specs the scheduler can rely on.

Why in proto: a constraint such as ``--constraint a100`` is part of the job contract, so the names
it may use, and how a family name ("a100") matches a model ("a100-80gb"), must be one shared
definition. Specs are vendor datasheet figures (memory, TDP, dense FP16/FP32 TFLOPS, memory
bandwidth); performance *profiles* learnt from benchmarks live in ``libs.policy.profiles``.

A cluster may hold a model that is not listed here (a new H200, say). Nothing refuses it: the
node's own spec says its memory, and ``libs.policy.profiles`` estimates speed and power from
whatever specs are known, and says that it did.
"""

from __future__ import annotations

import re

import msgspec


class GpuModelSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Datasheet figures for one GPU model (per GPU)."""

    model: str
    mem_gb: float
    tdp_w: float
    idle_w: float
    fp16_tflops: float  # dense tensor-core FP16 (no sparsity)
    fp32_tflops: float
    mem_bw_gbps: float
    year: int
    source: str = "vendor datasheet"


def _g(
    model: str, mem: float, tdp: float, idle: float, fp16: float, fp32: float, bw: float, year: int
) -> GpuModelSpec:
    return GpuModelSpec(
        model=model,
        mem_gb=mem,
        tdp_w=tdp,
        idle_w=idle,
        fp16_tflops=fp16,
        fp32_tflops=fp32,
        mem_bw_gbps=bw,
        year=year,
    )


# Idle power: NVML readings of idle datacenter GPUs are typically 8-15% of TDP; we use ~0.15.
CATALOG: dict[str, GpuModelSpec] = {
    s.model: s
    for s in (
        _g("k80", 12, 150, 25, 0.0, 4.1, 240, 2014),  # per GK210 die (a K80 board holds two)
        _g("p100", 16, 250, 30, 18.7, 9.3, 732, 2016),
        _g("v100-16gb", 16, 300, 40, 125, 15.7, 900, 2017),
        _g("v100-32gb", 32, 300, 40, 125, 15.7, 900, 2018),
        _g("t4", 16, 70, 10, 65, 8.1, 320, 2018),
        _g("rtx6000", 24, 260, 30, 130, 16.3, 672, 2018),
        _g("rtx2080ti", 11, 250, 25, 107, 13.4, 616, 2018),
        _g("a100-40gb", 40, 400, 55, 312, 19.5, 1555, 2020),
        _g("a100-80gb", 80, 400, 55, 312, 19.5, 2039, 2020),
        _g("a800", 80, 400, 55, 312, 19.5, 2039, 2022),
        _g("a10", 24, 150, 20, 125, 31.2, 600, 2021),
        _g("a40", 48, 300, 35, 150, 37.4, 696, 2020),
        _g("l4", 24, 72, 12, 121, 30.3, 300, 2023),
        _g("l40s", 48, 350, 40, 362, 91.6, 864, 2023),
        _g("h100", 80, 700, 70, 989, 67, 3350, 2022),
        _g("h100-pcie", 80, 350, 50, 756, 51, 2000, 2022),
        _g("h800", 80, 700, 70, 989, 67, 3350, 2023),
        _g("h200", 141, 700, 75, 989, 67, 4800, 2024),
    )
}

# Names that operators and traces use for the same model.
ALIASES: dict[str, str] = {
    "v100": "v100-32gb",
    "v100m32": "v100-32gb",
    "v100m16": "v100-16gb",
    "v100-sxm2": "v100-32gb",
    "a100": "a100-80gb",
    "a100-sxm4": "a100-80gb",
    "a100-sxm": "a100-80gb",
    "a10g": "a10",
    "h100-sxm": "h100",
    "h100-sxm5": "h100",
    "quadro-rtx-6000": "rtx6000",
    "rtx-6000": "rtx6000",
}

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,31}$")


def canonical_model(name: str) -> str:
    """Lower-case, drop vendor words, map aliases: "Tesla V100-SXM2-32GB" -> "v100-32gb"."""
    n = name.strip().lower().replace("nvidia", "").replace("tesla", "").strip(" -_")
    n = re.sub(r"[\s_]+", "-", n)
    if n in CATALOG:
        return n
    if n in ALIASES:
        return ALIASES[n]
    # "v100-sxm2-32gb" -> v100-32gb; "h100-80gb-hbm3" -> h100; "a10g-24gb" -> a10
    head = n.split("-", 1)[0]
    mem = re.search(r"(\d+)gb", n)
    if mem and f"{head}-{mem.group(1)}gb" in CATALOG:
        return f"{head}-{mem.group(1)}gb"
    if head in CATALOG:
        return head
    if head in ALIASES:
        return ALIASES[head]
    return n


def family(model: str) -> str:
    """The family a constraint may name: "a100-80gb" -> "a100", "h100-pcie" -> "h100"."""
    return model.split("-", 1)[0]


def is_valid_name(name: str) -> bool:
    return bool(_NAME.match(name))


def known_names(extra_models: tuple[str, ...] | list[str] = ()) -> set[str]:
    """Every name a constraint may use: catalog models, their families, aliases, and extra models
    (those present in the live cluster even if the catalog does not list them)."""
    names = set(CATALOG) | {family(m) for m in CATALOG} | set(ALIASES)
    for m in extra_models:
        names.add(m)
        names.add(family(m))
    return names


def matches(constraint: str, model: str) -> bool:
    """True when a job's constraint admits a node's GPU model (exact model, alias or family)."""
    c = canonical_model(constraint)
    return c == model or c == family(model) or constraint.lower() == family(model)
