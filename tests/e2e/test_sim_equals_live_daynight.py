"""Sim == live with the day/night calendar on (issue 16): the sim-equals-live workload, a quarter
of it inference jobs, with a "day" of 00:20-02:00 UTC, so the switch to day (inference boost,
10% headroom, warm reserve) falls inside the first wave and the switch to night (training
boost, speed weight x1.5) in the quiet hour; placements and power decisions are identical in
the simulator and on the live services. (The workload is not moved to a later hour: before the
first arrival the engine has no event, so takes no power step, while the live placer is
stepped to its power checks from t=0; that difference is the drivers', not the calendar's.)
Slow (a live run is 20-40 s on 2 cores): `make test-all`; the default suite checks each
driver at the switch (tests/sim/test_daynight.py, tests/services/test_placer_daynight.py)."""

from __future__ import annotations

import msgspec
import pytest

from libs.policy.inventory import demo_cluster
from libs.policy.profiles import ProfileTable
from libs.policy_io.overrides import apply_overrides
from libs.policy_io.policy_file import ENV, write_policy_file
from libs.sim.engine import simulate
from libs.sim.trace import TraceJob
from tests.e2e.test_sim_equals_live import Live, Record, Recording, lived, workload
from tests.e2e.test_sim_equals_live import live as live  # the fixture

SETS = ["calendar.enabled=true", "calendar.day.hours=00:20-02:00"]
SWITCHES_S = (20 * 60.0, 2 * 3600.0)


@pytest.fixture
def calendar_file(tmp_path, monkeypatch) -> None:
    """The live services read the calendar from the policy file (``MOSAIC_POLICY_FILE``);
    requested before ``live``, so the placer starts with it."""
    cfg, _ = apply_overrides(SETS)
    monkeypatch.setenv(ENV, str(write_policy_file(tmp_path / "policy.json", cfg)))


def with_inference(seed: int):
    """The workload, every fourth job an inference job."""
    return [
        (t, msgspec.structs.replace(s, kind="inference" if i % 4 == 0 else "training"))
        for i, (t, s) in enumerate(workload(seed))
    ]


@pytest.mark.slow
async def test_the_live_services_follow_the_calendar_exactly_as_the_simulator(
    calendar_file: None, live: Live
) -> None:
    nodes = sorted(demo_cluster(), key=lambda n: n.id)
    jobs = with_inference(21)
    cfg, _ = apply_overrides(SETS)
    policy = Recording(cfg)
    trace = [TraceJob(spec=s, submit_s=t) for t, s in jobs]
    result = simulate(trace, nodes, policy, ProfileTable.default().covering(nodes))
    sim = Record(policy.placed, policy.powered, max(j.end_s for j in result.jobs), policy.moved)
    to_day, to_night = SWITCHES_S
    times = [t for t, *_ in sim.placements]
    assert min(times) < to_day < max(t for t in times if t < to_night), "no placement by day"
    assert max(times) > to_night, "nothing placed after the switch to night"
    got = await lived(live, jobs)
    assert got.placements == sim.placements
    assert got.moves == sorted(sim.moves)
    end = min(sim.end_s, got.end_s)
    assert [p for p in got.power if p[0] < end] == sorted(p for p in sim.power if p[0] < end)
