"""The shared --node-spec flag and subject-mapped message types."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from libs.bus import Bus
from libs.bus.connection import subject_matches
from libs.bus.nodeargs import node_specs_from_args, parse_node_specs
from proto import subjects
from proto.commands import KillCommand, RunCommand
from proto.ledger import Allocation
from proto.nodes import NodeSpec
from tests.bus.conftest import wait_for

NODE = NodeSpec(
    id="t4-0",
    gpu_model="t4",
    gpu_count=4,
    gpu_mem_gb=16,
    host_mem_gb=128,
    cpus=32,
    idle_power_w=10,
    max_power_w=70,
)


def test_node_spec_forms(tmp_path: Path) -> None:
    one = msgspec.json.encode(NODE).decode()
    assert parse_node_specs(one) == [NODE]
    assert parse_node_specs(f"[{one}]") == [NODE]
    f = tmp_path / "nodes.json"
    f.write_text(f"[{one}]")
    assert parse_node_specs(f"@{f}") == [NODE]
    cluster = tmp_path / "cluster.json"
    cluster.write_text(
        '{"groups": [{"count": 2, "gpu_model": "v100", "gpu_count": 4, "host_mem_gb": 256}]}'
    )
    nodes = parse_node_specs(f"@{cluster}")
    assert len(nodes) == 2 and all(n.gpu_count == 4 for n in nodes)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{nope", "not valid JSON"),
        ('{"id": "a"}', "missing required field"),
        ("@/does/not/exist.json", "cannot read"),
        (
            '{"id": "a.b", "gpu_model": "t4", "gpu_count": 1, "gpu_mem_gb": 16, "host_mem_gb": 1,'
            ' "cpus": 1, "idle_power_w": 1, "max_power_w": 2}',
            "node id",
        ),
    ],
)
def test_bad_node_spec_is_a_clear_error(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_node_specs(value)


def test_duplicate_node_ids_refused() -> None:
    one = msgspec.json.encode(NODE).decode()
    with pytest.raises(ValueError, match="t4-0"):
        node_specs_from_args([one, one])


def test_subject_matches() -> None:
    assert subject_matches("node.a.*", "node.a.run")
    assert not subject_matches("node.a.*", "node.a.run.x")
    assert subject_matches("node.>", "node.a.run")
    assert not subject_matches("node.>", "node")
    assert not subject_matches("node.b.run", "node.a.run")


async def test_types_by_subject(bus: Bus) -> None:
    got: list[object] = []

    async def handler(cmd: object) -> None:
        got.append(cmd)

    alloc = Allocation(
        job_id="j",
        node="t4-0",
        gpu_indices=(0,),
        gpu_share=1.0,
        gpu_mem_gb=8,
        host_mem_gb=8,
        cpus=1,
        time=1.0,
    )
    types = {"node.*.run": RunCommand, "node.*.kill": KillCommand}
    await bus.consume(subjects.STREAM_NODECMD, "node.t4-0.*", types, handler, durable="x")
    await bus.publish(
        subjects.node_command("t4-0", "run"), RunCommand(allocation=alloc, runtime_s=5)
    )
    await bus.publish(subjects.node_command("t4-0", "kill"), KillCommand(job_id="j", reason="r"))
    await wait_for(lambda: len(got) == 2, what="two commands")
    assert isinstance(got[0], RunCommand) and isinstance(got[1], KillCommand)
