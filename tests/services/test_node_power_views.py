"""Where the power state is shown: the gateway's nodes model (``put_report``), ``mosaic nodes``
and the dashboard. Pure: no NATS."""

from __future__ import annotations

import io

from rich.console import Console

from libs.client.tables import nodes_table
from proto.nodes import ExecutorReport, NodeSpec
from proto.power import PowerState
from services.gateway.dashboard import render
from services.gateway.nodes_view import NodesModel

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


def report(t: float, power: PowerState, boot: str = "b") -> ExecutorReport:
    return ExecutorReport(node="n1", time=t, boot_id=boot, interval_s=5.0, power=power)


def test_the_model_keeps_the_latest_power_state() -> None:
    m = NodesModel()
    m.put_spec("n1", SPEC)
    assert m.views()[0].power.state == "awake"  # no report yet
    m.put_report(report(10, PowerState(state="asleep", since=10)))
    m.put_report(report(9, PowerState(state="awake", since=0)))  # late and older: ignored
    assert m.views()[0].power.state == "asleep"
    m.put_report(report(11, PowerState(state="waking", since=11, ready_at=float("nan"))))
    assert m.views()[0].power.state == "asleep"  # unsound: refused
    m.put_report(report(1, PowerState(since=1), boot="b2"))  # a restarted executor: awake
    assert m.views()[0].power.state == "awake"


def _text(table: object) -> str:
    buf = io.StringIO()
    Console(file=buf, width=200).print(table)
    return buf.getvalue()


def test_mosaic_nodes_and_the_dashboard_show_power() -> None:
    m = NodesModel()
    m.put_spec("n1", SPEC)
    m.put_report(report(10, PowerState(state="waking", since=10, ready_at=310)))
    out = _text(nodes_table(m.views()))
    assert "POWER" in out and "WATTS" in out and "waking (up at 310)" in out
    m.put_report(report(20, PowerState(state="asleep", since=20)))
    assert "asleep" in _text(nodes_table(m.views()))
    page = render(m.views(), [], {})
    assert "<th>power</th>" in page and "<td>asleep</td>" in page
