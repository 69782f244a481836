"""The placer's side of node power (issue 13): sending suspend/wake commands and folding each
node's power state from its executor's reports.

Why a fold of the reports and not of the commands sent: the executor owns the fact (it may
refuse a suspend, a boot takes its own time, a restarted executor is awake), so the placer
believes the node, never its own intent. The scheduler is told what changed through
``awake_events()`` ("node X is awake now") and ``refusal_events()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from libs.bus.connection import Bus
from proto import subjects
from proto.nodes import ExecutorReport
from proto.power import QUIET_STATES, PowerAction, PowerCommand, PowerRefusal, PowerState


def power_msg_id(node: str, action: str, now: float) -> str:
    """Deterministic, so a takeover that repeats a decision is dropped by JetStream."""
    return f"power-{node}-{action}-{now:.3f}"


async def send_power_commands(
    bus: Bus, suspend: Sequence[str], wake: Sequence[str], now: float, reason: str
) -> int:
    """Publish ``node.<node>.power`` for each node (durable, NODECMD); returns how many the
    stream took as new (a repeat within the duplicate window is not counted)."""
    sent = 0
    orders: list[tuple[str, PowerAction]] = [(n, "suspend") for n in suspend]
    orders += [(n, "wake") for n in wake]
    for node, action in orders:
        cmd = PowerCommand(node=node, action=action, time=now, reason=reason)
        if await bus.publish(
            subjects.node_command(node, subjects.POWER_VERB),
            cmd,
            msg_id=power_msg_id(node, action, now),
        ):
            sent += 1
    return sent


@dataclass(frozen=True)
class PowerChange:
    node: str
    old: str  # the state before ("awake" for a node not seen yet)
    new: PowerState


class NodePower:
    """Each node's latest reported power state. A node never reported is awake (an executor
    without power support is an awake node). Pure: fed ``ExecutorReport``s."""

    def __init__(self) -> None:
        self.states: dict[str, PowerState] = {}
        self._last: dict[str, tuple[str, float]] = {}  # node -> (boot id, report time)
        self._awake: list[tuple[str, float]] = []
        self._refusals: list[tuple[str, PowerRefusal]] = []

    def on_report(self, report: ExecutorReport) -> PowerChange | None:
        """Fold one report; returns the change of state it brought, if any. An older report of
        the same executor arriving late (plain NATS) is ignored."""
        last = self._last.get(report.node)
        if last is not None and last[0] == report.boot_id and report.time < last[1]:
            return None
        self._last[report.node] = (report.boot_id, report.time)
        old = self.states.get(report.node)
        new = report.power
        self.states[report.node] = new
        if new.refused is not None and (old is None or old.refused != new.refused):
            self._refusals.append((report.node, new.refused))
        old_state = old.state if old is not None else "awake"
        if old is not None and (old.state, old.since) == (new.state, new.since):
            return None
        if new.state == old_state:
            return None
        if new.state == "awake":
            self._awake.append((report.node, new.since))
        return PowerChange(report.node, old_state, new)

    def state(self, node: str) -> str:
        st = self.states.get(node)
        return st.state if st is not None else "awake"

    def asleep(self) -> set[str]:
        """Nodes asleep or going to sleep: hold no job, and may be silent."""
        return {n for n, st in self.states.items() if st.state in QUIET_STATES}

    def waking(self) -> dict[str, float]:
        """Nodes booting -> the Mosaic time each expects to be awake."""
        return {
            n: st.ready_at if st.ready_at is not None else st.since
            for n, st in self.states.items()
            if st.state == "waking"
        }

    def quiet(self, now: float) -> set[str]:
        """Nodes whose silence is expected at Mosaic time ``now``: asleep, suspending, or
        waking before their ``ready_at`` (a real node says nothing while it boots)."""
        booting = {n for n, ready_at in self.waking().items() if now <= ready_at}
        return self.asleep() | booting

    def awake_events(self) -> list[tuple[str, float]]:
        """(node, since) for each node that became awake since the last call, oldest first."""
        out, self._awake = self._awake, []
        return out

    def refusal_events(self) -> list[tuple[str, PowerRefusal]]:
        """(node, refusal) for each power command a node refused since the last call."""
        out, self._refusals = self._refusals, []
        return out
