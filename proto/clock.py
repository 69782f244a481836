"""The stepped clock's messages (``libs/clock.py`` in ``MOSAIC_CLOCK_MODE=stepped``).

Why a stepped clock: a test that runs one workload through the simulator and the live services
(issue 13, part 8) must make the live side see exactly the simulator's instants. A controller
sets Mosaic time explicitly (``Step``) and waits until every participant has drained its work
at that time (``StepAck``) before the next step.
"""

from __future__ import annotations

import msgspec


class Step(msgspec.Struct, frozen=True, kw_only=True):
    """``clock.step``: Mosaic time is ``now`` from step ``seq`` on. ``round`` counts the
    re-publications of one step (the barrier's probes): same ``seq`` and ``now``, a new round."""

    seq: int
    now: float
    round: int = 0
    # the decide phase: once everyone settled what happened at ``now`` (ends, arrivals, boots),
    # the scheduler decides once, and everyone settles what it decided (runs, power commands)
    decide: bool = False


class StepAck(msgspec.Struct, frozen=True, kw_only=True):
    """``clock.ack.<participant>``: ``participant`` has no pending work at step ``seq`` (probe
    ``round``). ``handled`` counts the work items it has finished since it started, so the
    controller can tell a quiet round from one in which a message was still on its way."""

    participant: str
    seq: int
    round: int = 0
    handled: int = 0
    # the next Mosaic time this participant has something due at (a job's end, a boot, the
    # scheduler's next backfill or power check), or None: the controller steps there next
    next_s: float | None = None
