"""Render a cluster file into one NodeSpec JSON file per node, for ``--node-spec @FILE``.

Why: the executor and telemetry services take explicit node specs (``--node-spec JSON_OR_@FILE``),
while operators describe a cluster as groups (``libs.policy.inventory.ClusterFile``). This turns
the one into the other with the same expansion the simulator and ``mosaic up`` use, so the compose
cluster is the demo cluster node for node. ``--check`` fails when the committed files are stale.

    python deploy/clusters/render.py deploy/clusters/demo.json deploy/clusters/nodes
    python deploy/clusters/render.py --check deploy/clusters/demo.json deploy/clusters/nodes
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def render(cluster_file: Path) -> dict[str, bytes]:
    """File name -> pretty JSON NodeSpec, one per node of ``cluster_file``."""
    import msgspec

    from libs.policy.inventory import load_cluster_file

    nodes = load_cluster_file(cluster_file.read_bytes())
    return {
        f"{n.id}.json": msgspec.json.format(msgspec.json.encode(n), indent=2) + b"\n" for n in nodes
    }


def stale(rendered: dict[str, bytes], out_dir: Path) -> list[str]:
    """Names that differ between ``rendered`` and ``out_dir`` (missing, changed or extra)."""
    present = {p.name for p in out_dir.glob("*.json")} if out_dir.is_dir() else set()
    bad = sorted(name for name in present - rendered.keys())
    for name, data in rendered.items():
        path = out_dir / name
        if not path.is_file() or path.read_bytes() != data:
            bad.append(name)
    return sorted(bad)


def write(rendered: dict[str, bytes], out_dir: Path) -> None:
    """Replace the ``*.json`` files of ``out_dir`` with ``rendered``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.json"):
        if old.name not in rendered:
            old.unlink()
    for name, data in rendered.items():
        (out_dir / name).write_bytes(data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cluster_file", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--check", action="store_true", help="exit 1 if out_dir is stale")
    args = parser.parse_args(argv)
    rendered = render(args.cluster_file)
    if args.check:
        bad = stale(rendered, args.out_dir)
        if bad:
            print(f"stale node specs in {args.out_dir}: {', '.join(bad)}", file=sys.stderr)
            return 1
        return 0
    write(rendered, args.out_dir)
    for name in rendered:
        print(args.out_dir / name)
    return 0


if __name__ == "__main__":
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    sys.exit(main())
