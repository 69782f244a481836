"""The profiler end to end (issue 15): a real stack whose A100 really runs CNN jobs at a quarter
of a V100 (the simulated executor's ``mosaic/sim-speed`` label) while the shipped table says it
is faster. The first jobs go to the A100, as the table says; within ``min_samples`` completed
jobs the profiler's table in KV ``profiles`` has the A100's true speed, the placer uses it and
the next job goes to the V100. ``mosaic profiles`` shows the entry as learnt.

Each node also runs a long anchor job (another class) on one of its two GPUs, so neither is
idle long enough to be suspended: the choice between them is the profile's alone.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from rich.console import Console

from libs.client.api import MosaicClient
from libs.client.cli_profiles import profiles_table
from libs.client.supervisor import Stack, start_stack
from libs.policy.profile_learning import LearningConfig
from libs.policy.profiles import ProfileTable
from proto.jobs import JobSpec
from proto.nodes import NodeSpec
from services.executor.runners import SIM_SPEED_LABEL
from tests.e2e.conftest import E2E_CLOCK_FACTOR, require_services, wait_for

A100_TRUE_SPEED = 0.25  # the table says about 1.2-1.8 for CNNs
V100_TRUE_SPEED = 1.0  # the reference: the table is right about it


def _node(nid: str, model: str, mem_gb: float, speed: float) -> NodeSpec:
    return NodeSpec(
        id=nid,
        gpu_model=model,
        gpu_count=2,
        gpu_mem_gb=mem_gb,
        host_mem_gb=256,
        cpus=32,
        idle_power_w=50,
        max_power_w=300,
        labels={SIM_SPEED_LABEL: str(speed)},
    )


NODES = [
    _node("a100-0", "a100-80gb", 80, A100_TRUE_SPEED),
    _node("v100-0", "v100-32gb", 32, V100_TRUE_SPEED),
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    require_services()
    data = tmp_path_factory.mktemp("profiler")
    # placement by speed alone: the simulated telemetry heats the busy A100, and on a loaded
    # machine its temperature term (w_thermal) sometimes tipped a choice to the V100 before the
    # table was learnt, which is not what this test is about
    policy = data / "policy.json"
    policy.write_text(json.dumps({"w_thermal": 0.0}))
    s = start_stack(
        NODES,
        clock_factor=E2E_CLOCK_FACTOR,
        data_dir=data,
        extra_env={"MOSAIC_POLICY_FILE": str(policy)},
    )
    try:
        yield s
    finally:
        forced = s.stop()
        assert not forced, f"services needed SIGKILL to stop: {forced} (logs in {s.logs_dir})"


def _state(client: MosaicClient, jid: str) -> tuple[str, str | None]:
    j = client.job(jid)
    return j.state, j.node


def _run(stack: Stack, spec: JobSpec, *, until: str) -> str:
    """Submit ``spec``, wait until it is ``until`` (running | completed); its node."""
    client = stack.client()
    client.submit(spec)
    states = ("running", "completed") if until == "running" else ("completed",)
    wait_for(
        lambda: _state(client, spec.id)[0] in states,
        timeout_s=30,
        what=f"{spec.id} {until}",
        stack=stack,
    )
    node = _state(client, spec.id)[1]
    assert node is not None
    return node


def _anchor(stack: Stack, jid: str, on: str, off: str, cls: str) -> None:
    """A long 1-GPU job of another class on ``on`` (``off`` cordoned while it is placed; the
    class one the table says runs faster on ``on``, or the job would wait for ``off``)."""
    client = stack.client()
    client.cordon(off, "test: the anchor goes elsewhere")
    spec = JobSpec(id=jid, gpus=1, gpu_mem_gb=8, workload_class=cls, est_runtime_s=3600 * 24)
    assert _run(stack, spec, until="running") == on
    client.uncordon(off)


def test_the_profile_moves_to_the_truth_and_placement_follows(stack: Stack) -> None:
    client = stack.client()
    _anchor(stack, "anchor-a", "a100-0", "v100-0", "transformer")
    _anchor(stack, "anchor-v", "v100-0", "a100-0", "rnn")
    table = ProfileTable.default()
    assert table.speed("a100-80gb", "cnn") > 1.0  # the table is wrong about the A100
    # half a wall second on the A100 at its true speed (a quarter of a V100)
    est_s = 0.5 * E2E_CLOCK_FACTOR * A100_TRUE_SPEED
    n = LearningConfig().min_samples
    where = []
    for i in range(n + 1):
        spec = JobSpec(
            id=f"cnn-{i}", gpus=1, gpu_mem_gb=8, workload_class="cnn", framework="pytorch",
            est_runtime_s=est_s,
        )  # fmt: skip
        where.append(_run(stack, spec, until="completed"))
        if i == n - 1:  # the n-th completion: the profile must reach the truth
            wait_for(
                lambda: client.profiles().version >= n,
                timeout_s=15,
                what="the profiler's table after n jobs",
                stack=stack,
            )
            time.sleep(0.3)  # the placer's watch of the same key: milliseconds behind
    assert where[:n] == ["a100-0"] * n  # the table's choice while it was wrong
    assert where[n] == "v100-0"  # placement follows the learnt table
    listing = client.profiles()
    (row,) = [
        r
        for r in listing.rows
        if (r.model, r.workload_class, r.framework) == ("a100-80gb", "cnn", "*")
    ]
    assert row.source == "learnt" and row.samples == n
    assert row.speed == pytest.approx(A100_TRUE_SPEED, rel=0.15)
    assert any(r.framework == "pytorch" and r.model == "a100-80gb" for r in listing.rows)
    console = Console(record=True, width=120)
    console.print(profiles_table(listing, "A100-80GB"))
    text = console.export_text()
    assert "a100-80gb" in text and "learnt" in text and "v100-32gb" not in text
