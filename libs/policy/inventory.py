"""Cluster inventories: the seed mix, the 10-node demo, counts per GPU type, node groups.

Pure: text and numbers in, ``NodeSpec`` lists out. The simulator and ``mosaic up`` build their
clusters here, so a simulated cluster and a live one are the same shape. Cluster files (JSON
with ``groups``/``nodes``) are read by ``libs.policy_io.cluster_file``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from libs.policy.stages.gang import NODES_PER_SWITCH, SWITCH_LABEL
from proto.gpus import CATALOG, canonical_model
from proto.nodes import NodeSpec


@dataclass(frozen=True, kw_only=True)
class NodeGroup:
    """``count`` identical nodes. Missing specs come from the GPU catalog (a cluster file
    decodes its ``groups`` into these)."""

    count: int
    gpu_model: str
    gpu_count: int
    host_mem_gb: float
    cpus: int | None = None
    gpu_mem_gb: float | None = None
    idle_power_w: float | None = None
    max_power_w: float | None = None
    prefix: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


# The seed's mix: 40% 8xA100-80GB + 256 GB, 30% 4xV100-32GB + 128 GB, 30% 8xT4-16GB + 64 GB.
SEED_MIX: tuple[tuple[float, str, int, float, int], ...] = (
    (0.4, "a100-80gb", 8, 256.0, 64),
    (0.3, "v100-32gb", 4, 128.0, 32),
    (0.3, "t4", 8, 64.0, 32),
)


def expand(groups: tuple[NodeGroup, ...] | list[NodeGroup]) -> list[NodeSpec]:
    """Turn groups into nodes named ``<prefix>-<i>`` (prefix defaults to the GPU family).

    Every node gets a ``switch`` label (``stages.gang.SWITCH_LABEL``) unless its group gives
    one: ``<prefix>-sw<i // NODES_PER_SWITCH>``, so consecutive nodes of a prefix share a leaf
    switch, as racks are cabled; gangs prefer nodes of one switch."""
    nodes: list[NodeSpec] = []
    used: dict[str, int] = {}
    for g in groups:
        model = canonical_model(g.gpu_model)
        spec = CATALOG.get(model)
        mem = g.gpu_mem_gb if g.gpu_mem_gb is not None else (spec.mem_gb if spec else None)
        if mem is None:
            raise ValueError(f"GPU model {g.gpu_model!r} is not in the catalog: give gpu_mem_gb")
        tdp = g.max_power_w if g.max_power_w is not None else (spec.tdp_w if spec else 300.0)
        idle = (
            g.idle_power_w if g.idle_power_w is not None else (spec.idle_w if spec else 0.15 * tdp)
        )
        prefix = g.prefix or model.split("-", 1)[0]
        for _ in range(g.count):
            i = used.get(prefix, 0)
            used[prefix] = i + 1
            nodes.append(
                NodeSpec(
                    id=f"{prefix}-{i}",
                    gpu_model=model,
                    gpu_count=g.gpu_count,
                    gpu_mem_gb=float(mem),
                    host_mem_gb=float(g.host_mem_gb),
                    cpus=g.cpus if g.cpus is not None else 8 * g.gpu_count,
                    idle_power_w=float(idle),
                    max_power_w=float(tdp),
                    labels={SWITCH_LABEL: f"{prefix}-sw{i // NODES_PER_SWITCH}", **g.labels},
                )
            )
    return nodes


def seed_cluster(total_gpus: int) -> list[NodeSpec]:
    """The seed mix sized to about ``total_gpus`` GPUs (each share rounded to whole nodes)."""
    groups = []
    for share, model, per_node, host_mem, cpus in SEED_MIX:
        count = max(1, round(share * total_gpus / per_node))
        groups.append(
            NodeGroup(
                count=count, gpu_model=model, gpu_count=per_node, host_mem_gb=host_mem, cpus=cpus
            )
        )
    return expand(groups)


def demo_cluster() -> list[NodeSpec]:
    """The 10-node demo: 4 x (8xA100-80GB, 256 GB), 3 x (4xV100-32GB, 128 GB), 3 x (8xT4, 64 GB)."""
    return expand(
        [
            NodeGroup(count=4, gpu_model="a100-80gb", gpu_count=8, host_mem_gb=256, cpus=64),
            NodeGroup(count=3, gpu_model="v100-32gb", gpu_count=4, host_mem_gb=128, cpus=32),
            NodeGroup(count=3, gpu_model="t4", gpu_count=8, host_mem_gb=64, cpus=32),
        ]
    )


def from_counts(
    text: str, gpus_per_node: int = 4, host_mem_gb_per_gpu: float = 32.0
) -> list[NodeSpec]:
    """``"v100=36,p100=36,k80=36"``: that many GPUs of each model, in nodes of ``gpus_per_node``."""
    groups = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, _, count_text = part.partition("=")
        try:
            gpus = int(count_text)
        except ValueError:
            raise ValueError(f"cluster spec {part!r}: expected MODEL=GPUS, e.g. v100=36") from None
        if gpus <= 0:
            raise ValueError(f"cluster spec {part!r}: GPU count must be > 0")
        per = min(gpus_per_node, gpus)
        full = gpus // per
        groups.append(
            NodeGroup(
                count=full, gpu_model=name, gpu_count=per, host_mem_gb=host_mem_gb_per_gpu * per
            )
        )
        if gpus % per:
            groups.append(
                NodeGroup(
                    count=1,
                    gpu_model=name,
                    gpu_count=gpus % per,
                    host_mem_gb=host_mem_gb_per_gpu * (gpus % per),
                    prefix=f"{canonical_model(name).split('-', 1)[0]}r",
                )
            )
    if not groups:
        raise ValueError("empty cluster spec")
    return expand(groups)


def total_gpus(nodes: list[NodeSpec]) -> int:
    return sum(n.gpu_count for n in nodes)


def describe(nodes: list[NodeSpec]) -> str:
    """ "4x a100-80gb(8), 3x v100-32gb(4), ..." for logs and reports."""
    counts: dict[tuple[str, int], int] = {}
    for n in nodes:
        counts[(n.gpu_model, n.gpu_count)] = counts.get((n.gpu_model, n.gpu_count), 0) + 1
    return ", ".join(f"{c}x {m}({g})" for (m, g), c in counts.items()) + (
        f" = {total_gpus(nodes)} GPUs" if nodes else ""
    )
