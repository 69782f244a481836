"""A live placer on the stepped clock, as the day/night and inference tests run it: its own bus
user, fast cycles, power saving off, and a step controller over it and the executor."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from libs.bus import Bus
from libs.bus.steps import StepController
from libs.clock import SteppedClock
from libs.obs.logging import get_logger
from libs.obs.tracing import setup_tracing
from services.placer.service import Placer
from services.placer.settings import PlacerSettings


@asynccontextmanager
async def stepped_placer(
    bus: Bus, nats_url: str, cfg: Any, epoch: float
) -> AsyncIterator[tuple[Placer, StepController]]:
    """The placer running with policy ``cfg`` from ``epoch``, and the controller that steps
    it and the executor (``step_name="executor"``); both stopped on exit."""
    pbus = await Bus.connect(nats_url, "placer")
    settings = PlacerSettings(
        holder="live", tick_s=0.5, debounce_s=0.0, settle_s=0.0, power_saving=False
    )
    log, tracer = get_logger(service="placer"), setup_tracing("placer")
    placer = Placer(pbus, SteppedClock(epoch=epoch), log, tracer, settings, policy=cfg)
    await placer.start()
    stop = asyncio.Event()
    task = asyncio.create_task(placer.run(stop))
    ctl = StepController(bus, ["executor", "placer"], timeout_s=30)
    await ctl.start()
    try:
        yield placer, ctl
    finally:
        stop.set()
        await task
        await ctl.stop()
        await pbus.close()
