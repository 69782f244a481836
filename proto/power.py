"""Node power: the command the placer sends (suspend or wake) and the state the executor owns.

Why the state rides in ``ExecutorReport`` rather than a message of its own: the report is
already the executor's fact about its node, published on every change and every interval (plain
NATS, the latest wins), and every reader that needs the power state (placer, gateway, the
simulated telemetry) already folds it or can. A reader folds "the latest report per node" and
has the power state too, with no second stream to order against the first. An older executor's
report has no ``power`` field and decodes as awake, which is what it is.
"""

from __future__ import annotations

from typing import Literal

import msgspec

PowerAction = Literal["suspend", "wake"]
PowerStateName = Literal["awake", "suspending", "asleep", "waking"]
POWER_ACTIONS: tuple[str, ...] = ("suspend", "wake")
POWER_STATES: tuple[str, ...] = ("awake", "suspending", "asleep", "waking")
# states in which a node's silence is expected, not a failure (the machine is off or going off)
QUIET_STATES: tuple[str, ...] = ("suspending", "asleep")


class PowerCommand(msgspec.Struct, frozen=True, kw_only=True):
    """``node.<node>.power`` (durable, NODECMD): put the node to sleep or wake it. ``time`` is
    the Mosaic clock when the placer decided; ``reason`` is for the audit trail and the logs."""

    node: str
    action: PowerAction
    time: float
    reason: str = ""


class PowerRefusal(msgspec.Struct, frozen=True, kw_only=True):
    """The last power command the executor did not carry out, and why (e.g. suspend of a node
    that runs an attempt). Kept in the state so the placer and ``mosaic nodes`` can see it."""

    action: PowerAction
    time: float
    reason: str


class PowerState(msgspec.Struct, frozen=True, kw_only=True):
    """A node's power state, owned by its executor. ``since``: Mosaic time the state began;
    ``ready_at``: while waking, the Mosaic time the node is expected to be awake."""

    state: PowerStateName = "awake"
    since: float = 0.0
    ready_at: float | None = None
    refused: PowerRefusal | None = None
