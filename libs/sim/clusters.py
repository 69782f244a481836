"""The clusters a replay may name: the seed mix, openb's own inventory, the demo, Gavel's,
counts per GPU model, or a cluster file (``--cluster``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from libs.policy import inventory
from libs.policy_io.cluster_file import load_cluster_file
from proto.nodes import NodeSpec

CLUSTERS = (
    "seed",
    "openb",
    "demo",
    "gavel",
    "counts:MODEL=GPUS,...",
    "MODEL=GPUS,...",
    "FILE.json",
)


def resolve_cluster(name: str, gpus: int | None, trace: Any = None) -> list[NodeSpec]:
    """A cluster by name: seed (sized by ``gpus``), openb (the trace's inventory), demo, gavel
    (Gavel's 36 V100 + 36 P100 + 36 K80, nodes of up to 8 GPUs), counts (``v100=36,p100=36``
    with or without ``counts:``), or a cluster JSON file."""
    key = name.strip()
    if key == "seed":
        if not gpus or gpus <= 0:
            raise ValueError("cluster 'seed' needs --gpus N (N > 0)")
        return inventory.seed_cluster(gpus)
    if key == "demo":
        return inventory.demo_cluster()
    if key == "gavel":
        from libs.sim.loaders.gavel_recipe import CLUSTER, GPUS_PER_NODE

        return inventory.from_counts(CLUSTER, gpus_per_node=GPUS_PER_NODE)
    if key == "openb":
        if trace is None or not trace.nodes:
            raise ValueError("cluster 'openb' needs a trace that carries its inventory (openb)")
        return list(trace.nodes)
    if key.startswith("counts:"):
        return inventory.from_counts(key.removeprefix("counts:"))
    if "=" in key and not key.endswith(".json"):
        return inventory.from_counts(key)
    path = Path(key)
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise FileNotFoundError(f"cluster file not found: {path}")
        return load_cluster_file(path.read_bytes())
    raise ValueError(f"unknown cluster {name!r}; known: {', '.join(CLUSTERS)}")
