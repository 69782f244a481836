"""The placer under the stepped clock (``libs.bus.steps``; the sim-equals-live test).

Why its own loop: the simulator's engine runs one pass per instant, after every event of that
instant. Under a stepped clock the placer therefore cycles only in a step's decide phase (the
controller starts it once ends, boots and arrivals of the instant are settled), once per step,
after catching up with the lifecycle stream; and it tells the controller the next instant it is
owed (``Scheduler.wakeups``: the next backfill or power check) in its ack.

One more cycle in the same step when that cycle killed running jobs (a replica the scaler
stopped, issue 16): their executors answer ``Cancelled`` at the step's time, after the decide
cycle, and the GPUs are free only then (the ledger entry stays until the answer). Once every
kill of the step is answered (its ``Cancelled`` folded, so ``cancelling`` no longer holds it), the
placer cycles again at the same Mosaic time, as it would on the kick of any end unstepped, and
as the simulator handles the replica's end as an instant of its own at the same time
(``libs.sim.serving``). A kill never answered costs only that cycle: the next step has it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from libs.bus.steps import StepParticipant
from libs.bus.tasks import cancel_and_wait
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
    killed: set[str] = set()  # running jobs this step's cycles killed, not answered yet

    async def cycle() -> None:
        nonlocal killed
        await placer._catch_up()  # every event of the instant is folded first
        await placer.guarded_cycle()
        killed = set(placer.killed_in_cycle)

    async def settle(step: Step) -> None:
        nonlocal decided, killed
        placer.heartbeat.beat()
        if not (step.decide and placer.active):
            return
        if step.seq > decided:
            decided = step.seq
            await cycle()
        elif killed:  # a later round of the decide phase: are the kills answered?
            await placer._catch_up()
            killed &= placer.cancelling
            if not killed:
                await cycle()  # their GPUs are free at this instant (module docstring)

    serving = asyncio.create_task(participant.serve(settle))
    try:
        await stop.wait()
    finally:
        await cancel_and_wait(serving)
        await participant.stop()
