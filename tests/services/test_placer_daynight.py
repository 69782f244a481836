"""The day/night policy live (issue 16): the real placer and simulated executor on a real NATS
server and the stepped clock. At 19:00 (day) the placer keeps one GPU of four free for
inference; it owes itself the 20:00 switch (its step ack says so), and the pass at 20:00, under
the night's policy, starts the training job the headroom held."""

from __future__ import annotations

import asyncio

import msgspec

from libs.bus import Bus
from libs.bus.steps import StepController
from libs.clock import SteppedClock
from libs.obs.logging import get_logger
from libs.obs.tracing import setup_tracing
from libs.policy_io.overrides import apply_overrides
from proto.events import Placed
from proto.jobs import JobSpec
from services.executor.service import main as executor_main
from services.placer.service import Placer
from services.placer.settings import PlacerSettings
from tests.services._scorer_util import (
    lifecycle_events,
    poll,
    put_nodes,
    start_in_process,
    submit,
)
from tests.sim.helpers import node

H = 3600.0
T0 = 20 * 86_400.0 + 19 * H  # 19:00 UTC


async def test_the_live_placer_switches_policy_at_the_configured_hour(nats_url: str, tmp_path):
    cfg, _ = apply_overrides(
        ["calendar.enabled=true", "calendar.day.headroom_share=0.25", "power_saving=false"]
    )
    nodes = [node("n1", gpus=4)]
    bus = await Bus.connect(nats_url, "test")
    await bus.ensure_topology()
    await put_nodes(bus, nodes)
    executor = start_in_process(
        "executor",
        executor_main,
        nats_url,
        clock=SteppedClock(epoch=T0),
        mode="sim",
        node_spec=[msgspec.json.encode(n).decode() for n in nodes],
        log_dir=str(tmp_path / "logs"),
        report_interval=0.5,
        boot_s=cfg.resume_s,
        step_name="executor",
    )
    pbus = await Bus.connect(nats_url, "placer")
    settings = PlacerSettings(
        holder="live", tick_s=0.5, debounce_s=0.0, settle_s=0.0, power_saving=False
    )
    log, tracer = get_logger(service="placer"), setup_tracing("placer")
    placer = Placer(pbus, SteppedClock(epoch=T0), log, tracer, settings, policy=cfg)
    await placer.start()
    stop = asyncio.Event()
    task = asyncio.create_task(placer.run(stop))
    ctl = StepController(bus, ["executor", "placer"], timeout_s=30)
    await ctl.start()
    jobs = [JobSpec(id=f"t{i}", gpus=1, gpu_mem_gb=8, est_runtime_s=10 * H) for i in range(4)]

    async def arrive() -> None:
        for spec in jobs:
            await submit(bus, spec, now=T0)
        ids = {s.id for s in jobs}
        await poll(lambda: asyncio.sleep(0, ids <= set(placer.tracker.specs)), timeout_s=20)

    async def placed() -> dict[str, float]:
        return {e.job_id: e.time for e in await lifecycle_events(bus) if isinstance(e, Placed)}

    try:
        await poll(lambda: asyncio.sleep(0, placer.active and len(placer.nodes) == 1))
        await ctl.step(T0, decide=True, before_decide=arrive)
        assert sorted(await placed()) == ["t0", "t1", "t2"]  # one GPU kept for inference
        sched = placer.feed.sched
        assert sched is not None and sched.period == "day"
        assert sched.reason_of("t3") == "Headroom"
        assert ctl.next_s() == T0 + H  # the placer owes itself the switch to night
        await ctl.step(T0 + H - 1, decide=True)  # 19:59:59, still day: nothing starts
        assert len(await placed()) == 3 and sched.period == "day"
        await ctl.step(T0 + H, decide=True)
        assert placer.feed.sched.period == "night"
        assert (await placed())["t3"] == T0 + H
    finally:
        stop.set()
        await task
        code = await executor.close()
        await ctl.stop()
        await pbus.close()
        await bus.close()
    assert code == 0
