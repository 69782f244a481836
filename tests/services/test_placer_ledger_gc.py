"""The placer purges the ledger's delete markers, so the bounded bucket never fills with them."""

from __future__ import annotations

import asyncio

from libs.bus import Bus
from libs.clock import Clock
from libs.obs.logging import get_logger
from libs.obs.tracing import setup_tracing
from proto import subjects
from proto.jobs import JobSpec
from services.placer.service import Placer, PlacerSettings
from services.scorer.service import main as scorer_main
from tests.services._placer_executor import FakeExecutor
from tests.services._scorer_util import connect, poll, put_nodes, start_in_process, submit
from tests.services.test_placer import FAST, _all_terminal, small_cluster


async def _ledger_messages(bus: Bus) -> int:
    info = await bus.js.stream_info(f"KV_{subjects.KV_LEDGER}")
    return info.state.messages


async def test_ended_jobs_leave_no_delete_markers_in_the_ledger(nats_url: str) -> None:
    bus = await connect(nats_url)
    await put_nodes(bus, small_cluster())
    executor = FakeExecutor(bus, run_s=0.1)
    await executor.start()
    scorer = start_in_process("scorer", scorer_main, nats_url, rescore_s=0.5, debounce_s=0.05)
    pbus = await Bus.connect(nats_url, "placer")
    settings = PlacerSettings(holder="gc", purge_every_s=0.0, purge_after_s=0.0, **FAST)
    placer = Placer(pbus, Clock.from_env(), get_logger(service="gc"), setup_tracing("p"), settings)
    await placer.start()
    stop = asyncio.Event()
    task = asyncio.create_task(placer.run(stop))
    try:
        jobs = {f"gc-{i}" for i in range(5)}
        for job in sorted(jobs):
            await submit(bus, JobSpec(id=job, gpus=1))
        await poll(lambda: _all_terminal(bus, jobs), timeout_s=30)
        # each job put and deleted its key; the markers go within a few cycles
        await poll(lambda: _ledger_is_empty(bus), timeout_s=15)
    finally:
        stop.set()
        await task
        await pbus.close()
        assert await scorer.close() == 0
        await executor.close()
        await bus.close()


async def _ledger_is_empty(bus: Bus) -> bool:
    return await _ledger_messages(bus) == 0
