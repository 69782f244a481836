"""The placer's fold of node power (``services.placer.power.NodePower``) and nodewatch's rule
that an asleep node's silence is not a failure. Pure: reports are fed by hand."""

from __future__ import annotations

import asyncio
import types

import pytest
import structlog

from proto.nodes import ExecutorReport, NodeSpec
from proto.power import PowerRefusal, PowerState
from services.placer import nodewatch
from services.placer.nodewatch import NodeWatch
from services.placer.power import NodePower
from services.placer.reconcile import Reconciler, ReconcileSettings
from services.placer.tracker import JobTracker

SPEC = NodeSpec(
    id="n1",
    gpu_model="t4",
    gpu_count=4,
    gpu_mem_gb=16,
    host_mem_gb=64,
    cpus=16,
    idle_power_w=10,
    max_power_w=70,
)


def report(node: str, t: float, state: PowerState | None = None, boot: str = "b") -> ExecutorReport:
    return ExecutorReport(
        node=node, time=t, boot_id=boot, interval_s=1.0, power=state or PowerState(since=0.0)
    )


def test_fold_tracks_states_and_tells_when_a_node_is_awake() -> None:
    p = NodePower()
    assert p.state("n1") == "awake"  # never reported: awake
    p.on_report(report("n1", 1, PowerState(state="asleep", since=1)))
    assert p.asleep() == {"n1"}
    change = p.on_report(report("n1", 2, PowerState(state="waking", since=2, ready_at=7)))
    assert change is not None and (change.old, change.new.state) == ("asleep", "waking")
    assert p.waking() == {"n1": 7} and p.asleep() == set()
    assert p.quiet(6.0) == {"n1"} and p.quiet(8.0) == set()  # booting, then overdue
    assert p.on_report(report("n1", 3, PowerState(state="waking", since=2, ready_at=7))) is None
    p.on_report(report("n1", 7, PowerState(state="awake", since=7)))
    assert p.awake_events() == [("n1", 7)]
    assert p.awake_events() == []  # drained


def test_a_late_older_report_is_ignored_but_a_new_boot_is_not() -> None:
    p = NodePower()
    p.on_report(report("n1", 5, PowerState(state="asleep", since=5)))
    assert p.on_report(report("n1", 4, PowerState(since=0))) is None
    assert p.state("n1") == "asleep"
    p.on_report(report("n1", 1, PowerState(since=1), boot="b2"))  # restarted: awake
    assert p.state("n1") == "awake"


def test_refusals_are_told_once() -> None:
    p = NodePower()
    refusal = PowerRefusal(action="suspend", time=3, reason="busy: j1")
    p.on_report(report("n1", 3, PowerState(since=0, refused=refusal)))
    p.on_report(report("n1", 4, PowerState(since=0, refused=refusal)))
    assert p.refusal_events() == [("n1", refusal)]


class _Watch(NodeWatch):
    """The parts of a Placer that nodewatch reads."""

    def __init__(self) -> None:
        log = structlog.get_logger()
        self.bus = types.SimpleNamespace(service="placer", log=log)  # type: ignore[assignment]
        self.clock = types.SimpleNamespace(now=lambda: 100.0)  # type: ignore[assignment]
        self.log = log
        self.ledger = {}
        self.nodes = {"n1": SPEC, "n2": SPEC}
        self.temps = {}
        self.tracker = JobTracker()
        self.reconciler = Reconciler(ReconcileSettings(down_intervals=3), now=0.0)
        self._told_stale = set()
        self._kick = asyncio.Event()
        self.active = True  # type: ignore[misc]


def test_a_silent_asleep_node_is_not_down(monkeypatch: pytest.MonkeyPatch) -> None:
    wall = [0.0]
    monkeypatch.setattr(nodewatch, "time", types.SimpleNamespace(monotonic=lambda: wall[0]))
    w = _Watch()

    async def scenario() -> None:
        await w._on_report(report("n1", 1, PowerState(state="asleep", since=1)))
        await w._on_report(report("n2", 1))
        wall[0] = 10.0  # both silent for 10 intervals
        assert w.down_nodes() == {"n2"}  # the awake one is down, the asleep one is not
        await w._on_report(report("n1", 2, PowerState(state="waking", since=2, ready_at=50)))
        wall[0] = 20.0
        assert "n1" not in w.down_nodes()  # booting: Mosaic now 40 < ready_at 50
        assert w.sleeping_nodes() == {"n1"}  # but no job may land on it yet

    w.clock = types.SimpleNamespace(now=lambda: 40.0)  # type: ignore[assignment]
    asyncio.run(scenario())
    w.clock = types.SimpleNamespace(now=lambda: 60.0)  # type: ignore[assignment]
    assert "n1" in w.down_nodes()  # past ready_at and still silent: down
