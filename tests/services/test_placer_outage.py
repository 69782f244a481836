"""The placer's lease survives a NATS outage: with the server stopped the replica steps down
(its lease task keeps trying, /healthz stays 200), and once the server is back on the same port
and store it leads again and places a job. Also: health checks fail when the lease task or the
cycle loop is dead."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from libs.bus import Bus
from libs.bus.server import free_port, start_nats_server
from libs.clock import Clock
from libs.obs.health import Health
from libs.obs.logging import get_logger
from libs.obs.tracing import setup_tracing
from proto.events import Completed, Placed
from proto.jobs import JobSpec
from services.placer.service import Placer, PlacerSettings
from services.scorer.service import main as scorer_main
from tests.services._placer_executor import FakeExecutor
from tests.services._scorer_util import (
    by_job,
    connect,
    lifecycle_events,
    poll,
    put_nodes,
    start_in_process,
    submit,
)
from tests.services.test_placer import FAST, _placer, small_cluster


# soak-length: make test-all; losing NATS under a running placer stays covered by
# tests/e2e/test_nats_members.py and the chaos run
@pytest.mark.slow
async def test_placer_leads_again_after_nats_restarts(tmp_path: Path):
    port, store = free_port(), tmp_path / "nats"
    server = start_nats_server(store, port=port)
    url = server.url
    try:
        bus = await connect(url)
        await put_nodes(bus, small_cluster())
        await bus.close()
        p, task, stop, pbus = await _placer(url, "survivor")
        await poll(lambda: asyncio.sleep(0, p.active), timeout_s=20)
        server.stop()
        await poll(lambda: asyncio.sleep(0, not p.active), timeout_s=20)
        # the lease expired and acquiring it failed on NATS errors (what used to kill the task)
        assert p.lease is not None
        await poll(lambda: asyncio.sleep(0, p.lease.last_error is not None), timeout_s=60)
        assert not task.done()
        assert p.leadership is not None and p.leadership.check() is None
        server = start_nats_server(store, port=port)
        await poll(lambda: asyncio.sleep(0, p.active), timeout_s=60, every_s=0.2)

        bus = await connect(url)
        executor = FakeExecutor(bus, run_s=0.2)
        await executor.start()
        scorer = start_in_process("scorer", scorer_main, url, rescore_s=0.5, debounce_s=0.05)
        try:
            await submit(bus, JobSpec(id="after-outage", gpus=1))

            async def done() -> list:
                evs = by_job(await lifecycle_events(bus)).get("after-outage", [])
                return evs if any(isinstance(e, Completed) for e in evs) else []

            evs = await poll(done, timeout_s=60, every_s=0.3)
        finally:
            stop.set()
            await task
            await pbus.close()
            assert await scorer.close() == 0
            await executor.close()
            await bus.close()
        assert sum(isinstance(e, Placed) for e in evs) == 1
        assert p.placed_count == 1
    finally:
        server.stop()


async def test_a_dead_lease_task_or_cycle_loop_makes_healthz_fail(nats_url):
    bus = await connect(nats_url)
    await put_nodes(bus, small_cluster())
    p, task, stop, pbus = await _placer(nats_url, "checked")
    health: Health = pbus.health
    try:
        await poll(lambda: asyncio.sleep(0, p.active), timeout_s=20)
        assert health.problems() == {}
        assert p.leadership is not None and p.leadership.task is not None
        p.leadership.task.cancel()  # whatever killed it, the check sees it
        await poll(lambda: asyncio.sleep(0, "placer_lease" in health.problems()))
        assert "lease task ended" in health.problems()["placer_lease"]
        p.heartbeat.max_age_s = 0.0  # as if the loop had not turned for longer than allowed
        await asyncio.sleep(0.01)
        assert "wedged" in health.problems()["placer_cycle"]
    finally:
        stop.set()
        await task
        await pbus.close()
        await bus.close()
    # once stopped on purpose, the lease check no longer complains
    assert "placer_lease" not in health.problems()


async def test_a_failing_takeover_is_retried_not_fatal(nats_url):
    bus = await connect(nats_url)
    await put_nodes(bus, small_cluster())
    pbus = await Bus.connect(nats_url, "placer")
    settings = PlacerSettings(holder="flaky", **FAST)
    p = Placer(
        pbus, Clock.from_env(), get_logger(service="flaky"), setup_tracing("placer"), settings
    )
    await p.start()
    real, calls = p._take_over, []

    async def flaky() -> None:
        calls.append(1)
        if len(calls) <= 2:
            raise RuntimeError("NATS timeout during takeover")
        await real()

    p._take_over = flaky  # type: ignore[method-assign]
    stop = asyncio.Event()
    task = asyncio.create_task(p.run(stop))
    try:
        await poll(lambda: asyncio.sleep(0, p.active), timeout_s=30)
        assert len(calls) == 3
        assert p.leadership is not None and p.leadership.failures == 2
        assert p.leadership.check() is None
    finally:
        stop.set()
        await task
        await pbus.close()
        await bus.close()
