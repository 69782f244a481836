"""Gang signals: how the executors of one multi-node job's parts start together and end together.

Plain NATS on ``gang.<job>.<attempt>`` (``subjects.gang``), between executors only. Each part's
executor says ``ready`` once its part is accepted and journaled, ``running`` while it runs (a
heartbeat: a peer that subscribed late still hears it), and ``ended`` when its part stopped for
any reason (``ok``: it completed). A part starts when every node of the gang said ready or
running; it ends when any peer says ended (``services.executor.gang``).
"""

from __future__ import annotations

from typing import Literal

import msgspec

GangState = Literal["ready", "running", "ended"]


class GangSignal(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    attempt: int
    node: str  # the part's node (who says it)
    state: GangState
    ok: bool = False  # ``ended``: the part completed (else it failed or was stopped)
    reason: str = ""  # ``ended``: why
