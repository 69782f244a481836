"""The placer under the stepped clock (``libs.bus.steps``; the sim-equals-live test).

Why its own loop: the simulator's engine runs one pass per instant, after every event of that
instant. Under a stepped clock the placer therefore cycles only in a step's decide phase (the
controller starts it once ends, boots and arrivals of the instant are settled), once per step,
after catching up with the lifecycle stream; and it tells the controller the next instant it is
owed (``Scheduler.wakeups``: the next backfill or power check) in its ack.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from libs.bus.steps import StepParticipant
from proto.clock import Step

if TYPE_CHECKING:
    from services.placer.service import Placer

STEP_NAME = "placer"


async def run_stepped(placer: Placer, stop: asyncio.Event) -> None:
    """Settle and ack steps until ``stop``."""
    participant = StepParticipant(
        placer.bus,
        placer.clock,
        STEP_NAME,
        handled=lambda: placer.tracker.events_seen + placer.placed_count,
        next_due=lambda: placer.next_tick_s,
    )
    await participant.start()
    decided = 0  # the last step whose decide phase ran a cycle

    async def settle(step: Step) -> None:
        nonlocal decided
        placer.heartbeat.beat()
        if step.decide and step.seq > decided and placer.active:
            decided = step.seq
            await placer._catch_up()  # every event of the instant is folded first
            await placer.guarded_cycle()

    serving = asyncio.create_task(participant.serve(settle))
    try:
        await stop.wait()
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        await participant.stop()
