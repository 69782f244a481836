"""The simulated telemetry backend's thermal model (libs.policy.thermal_model through
services.telemetry.backends): heat profiles, time steps, pins set and cleared at run time; and
the thermal service's flags."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from libs.policy.thermal_model import HEAT_LABEL
from proto.ledger import Allocation
from proto.nodes import NodeSpec
from services.telemetry.backends import HotSpot, SimulatedGpuBackend

ROOT = Path(__file__).resolve().parents[2]
A100 = NodeSpec(
    id="a100-0",
    gpu_model="a100-80gb",
    gpu_count=2,
    gpu_mem_gb=80,
    host_mem_gb=512,
    cpus=64,
    idle_power_w=55,
    max_power_w=400,
)
HOT = msgspec.structs.replace(A100, id="a100-9", labels={HEAT_LABEL: "1.6"})


def busy(node: str) -> Allocation:
    return Allocation(
        job_id=f"j-{node}",
        node=node,
        gpu_indices=(0,),
        gpu_share=1.0,
        gpu_mem_gb=10,
        host_mem_gb=8,
        cpus=4,
        time=0.0,
    )


def temps(sim: SimulatedGpuBackend, t: float) -> dict[str, list[float]]:
    return {s.node: [g.temp_c for g in s.gpus] for s in sim.sample(t)}


def test_a_hot_rack_runs_hotter_under_the_same_load_and_both_cool_when_idle() -> None:
    sim = SimulatedGpuBackend([A100, HOT], seed=4)
    sim.set_allocations([busy("a100-0"), busy("a100-9")])
    for k in range(1, 40):  # 5 s telemetry for over three minutes: the steady state
        got = temps(sim, 5.0 * k)
    assert 70 < got["a100-0"][0] < 80  # an ordinary A100 under load
    assert got["a100-9"][0] > 90 > got["a100-0"][0]  # the same load in a hot rack
    assert got["a100-9"][1] < 45  # its idle GPU stays cool
    sim.set_allocations([])
    after = temps(sim, 5.0 * 40 + 3600)  # an hour later, in one step: cooled
    assert all(c < 45 for c in after["a100-9"] + after["a100-0"])


def test_the_step_follows_the_clock() -> None:
    """One sample 5 s later heats a fifth of the way (tau 30 s); one 10 minutes later, all of it."""
    near = SimulatedGpuBackend([HOT], seed=1)
    far = SimulatedGpuBackend([HOT], seed=1)
    for sim in (near, far):
        sim.set_allocations([busy("a100-9")])
        sim.sample(0.0)
    a = temps(near, 5.0)["a100-9"][0]
    b = temps(far, 600.0)["a100-9"][0]
    assert a < 60 < 90 < b


def test_a_pin_can_be_set_and_cleared_while_running() -> None:
    sim = SimulatedGpuBackend([A100], seed=2)
    sim.pin(HotSpot(1, 95.0, "a100-0"))
    assert temps(sim, 5.0)["a100-0"][1] == pytest.approx(95.0, abs=1.0)
    sim.pin(HotSpot(1, 91.0, "a100-0"))  # replaces the earlier pin of that GPU
    assert temps(sim, 10.0)["a100-0"][1] == pytest.approx(91.0, abs=1.0)
    sim.unpin(1, "a100-0")
    cooled = [temps(sim, 10.0 + 30.0 * k)["a100-0"][1] for k in range(1, 8)]
    assert cooled[0] < 91
    assert cooled[-1] < 45  # idle: it cools from the pinned reading toward ambient
    with pytest.raises(ValueError, match="does not host"):
        sim.pin(HotSpot(0, 90.0, "t4-1"))


def test_a_bad_heat_label_is_an_error_naming_the_node() -> None:
    bad = msgspec.structs.replace(A100, labels={HEAT_LABEL: "very"})
    with pytest.raises(ValueError, match=r"a100-0.*mosaic/heat"):
        SimulatedGpuBackend([bad])


@pytest.mark.parametrize(
    ("flags", "word"), [(["--clear-c", "90"], "clear_c"), (["--window", "0"], "window")]
)
def test_thermal_service_rejects_bad_flags_naming_them(flags: list[str], word: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "services.thermal", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stderr
    assert word in proc.stderr
