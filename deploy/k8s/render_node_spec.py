"""Write this Kubernetes node's ``NodeSpec`` JSON for ``--node-spec @FILE`` (init container).

Why: the node agents are one DaemonSet, so their arguments cannot name a node. This runs in the
Mosaic image before telemetry/executor start, reads the node name (downward API) and the pool's
shape (ConfigMap ``mosaic-node-shape``), validates them as a ``NodeSpec`` and writes the file the
agent reads. Node names may contain dots (``ip-10-0-0-1.ec2.internal``), which NATS subjects
cannot: they become dashes; the original name is kept in the ``k8s-node`` label.

Environment: NODE_NAME, MOSAIC_GPU_MODEL, MOSAIC_GPU_COUNT, MOSAIC_GPU_MEM_GB, MOSAIC_HOST_MEM_GB,
MOSAIC_CPUS, MOSAIC_IDLE_POWER_W, MOSAIC_MAX_POWER_W. Argument: the output path.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

import msgspec

from proto.gpus import canonical_model
from proto.nodes import NodeSpec


def node_id(k8s_node_name: str) -> str:
    """A subject-safe Mosaic node id for a Kubernetes node name."""
    nid = k8s_node_name.strip().replace(".", "-")
    if not nid or any(c in nid for c in " *>"):
        raise ValueError(f"NODE_NAME {k8s_node_name!r} cannot be a Mosaic node id")
    return nid


def spec_from_env(env: Mapping[str, str]) -> NodeSpec:
    """The NodeSpec described by ``env``; a missing or malformed variable is a clear error."""

    def need(name: str) -> str:
        value = env.get(name, "").strip()
        if not value:
            raise ValueError(f"{name} is not set (ConfigMap mosaic-node-shape / downward API)")
        return value

    def number(name: str, kind: type[int] | type[float]) -> int | float:
        text = need(name)
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(f"{name}={text!r} is not a {kind.__name__}") from None
        if value < 0:
            raise ValueError(f"{name}={text!r} must be >= 0")
        return value

    name = need("NODE_NAME")
    return NodeSpec(
        id=node_id(name),
        gpu_model=canonical_model(need("MOSAIC_GPU_MODEL")),
        gpu_count=int(number("MOSAIC_GPU_COUNT", int)),
        gpu_mem_gb=float(number("MOSAIC_GPU_MEM_GB", float)),
        host_mem_gb=float(number("MOSAIC_HOST_MEM_GB", float)),
        cpus=int(number("MOSAIC_CPUS", int)),
        idle_power_w=float(number("MOSAIC_IDLE_POWER_W", float)),
        max_power_w=float(number("MOSAIC_MAX_POWER_W", float)),
        labels={"k8s-node": name},
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: render_node_spec.py OUT.json", file=sys.stderr)
        return 2
    try:
        spec = spec_from_env(os.environ)
    except ValueError as exc:
        print(f"render_node_spec: {exc}", file=sys.stderr)
        return 1
    with open(argv[0], "wb") as f:
        f.write(msgspec.json.encode(spec))
    print(f"render_node_spec: {spec.id} -> {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
