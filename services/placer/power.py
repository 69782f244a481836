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


def power_orders(
    suspend: Sequence[str], wake: Sequence[str], now: float, reason: str
) -> list[PowerCommand]:
    """The commands for one decision: suspends first, then wakes, each node in the given order."""
    actions: list[tuple[str, PowerAction]] = [(n, "suspend") for n in suspend]
    actions += [(n, "wake") for n in wake]
    return [PowerCommand(node=n, action=a, time=now, reason=reason) for n, a in actions]


async def send_power_command(bus: Bus, cmd: PowerCommand) -> bool:
    """Publish ``node.<node>.power`` (durable, NODECMD); False for a repeat the stream dropped
    (same node, action and decision time within the duplicate window)."""
    return await bus.publish(
        subjects.node_command(cmd.node, subjects.POWER_VERB),
        cmd,
        msg_id=power_msg_id(cmd.node, cmd.action, cmd.time),
    )


async def send_power_commands(
    bus: Bus, suspend: Sequence[str], wake: Sequence[str], now: float, reason: str
) -> int:
    """Publish ``node.<node>.power`` for each node (durable, NODECMD); returns how many the
    stream took as new (a repeat within the duplicate window is not counted)."""
    sent = 0
    for cmd in power_orders(suspend, wake, now, reason):
        if await send_power_command(bus, cmd):
            sent += 1
    return sent


class OwedPower:
    """Power commands the placer's scheduler decided that NODECMD has not taken yet.

    Why: the scheduler applies a power decision to its own state when it makes it (the node is
    booting, or asleep and cordoned), and only the node's report of a *different* state corrects
    that belief (``feed._sync_power``). A command lost to a NATS error (NODECMD electing a leader
    after a server died, its publish answered by no one) left the node as it was and the
    scheduler waiting for it: a wake never sent kept jobs waiting ``NodeWaking`` for good, a
    suspend never sent left an awake node cordoned as asleep, and its later wake (a repeat, to
    the executor) never made it "awake" again. So decisions are owed here first and sent in
    order; one that fails stays owed, with the ones after it, and the next cycle sends them
    again (same message ids: a command that did land is dropped as a duplicate).
    """

    def __init__(self) -> None:
        self._owed: list[PowerCommand] = []

    def __len__(self) -> int:
        return len(self._owed)

    def owe(self, suspend: Sequence[str], wake: Sequence[str], now: float, reason: str) -> None:
        self._owed += power_orders(suspend, wake, now, reason)

    def clear(self) -> None:
        """Forget what is owed: a new lease holder's scheduler starts from the nodes' word."""
        self._owed.clear()

    async def send(self, bus: Bus) -> int:
        """Send what is owed, oldest first; returns how many the stream took as new. Raises
        the publish error of the first that fails, which stays owed with those after it."""
        sent = 0
        while self._owed:
            if await send_power_command(bus, self._owed[0]):
                sent += 1
            self._owed.pop(0)
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
