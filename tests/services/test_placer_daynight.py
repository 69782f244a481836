"""The day/night policy live (issue 16): the real placer and simulated executor on a real NATS
server and the stepped clock. At 19:00 (day) the placer keeps one GPU of four free for
inference; it owes itself the 20:00 switch (its step ack says so), and the pass at 20:00, under
the night's policy, starts the training job the headroom held."""

from __future__ import annotations

import asyncio

import msgspec

from libs.bus import Bus
from libs.clock import SteppedClock
from libs.policy_io.overrides import apply_overrides
from proto.events import Placed
from proto.jobs import JobSpec
from services.executor.service import main as executor_main
from tests.services._scorer_util import (
    lifecycle_events,
    poll,
    put_nodes,
    start_in_process,
    submit,
)
from tests.services._stepped_placer import stepped_placer
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
    jobs = [JobSpec(id=f"t{i}", gpus=1, gpu_mem_gb=8, est_runtime_s=10 * H) for i in range(4)]

    try:
        async with stepped_placer(bus, nats_url, cfg, T0) as (placer, ctl):

            async def arrive() -> None:
                for spec in jobs:
                    await submit(bus, spec, now=T0)
                ids = {s.id for s in jobs}
                await poll(lambda: asyncio.sleep(0, ids <= set(placer.tracker.specs)), timeout_s=20)

            async def placed() -> dict[str, float]:
                return {
                    e.job_id: e.time for e in await lifecycle_events(bus) if isinstance(e, Placed)
                }

            await poll(lambda: asyncio.sleep(0, placer.active and len(placer.nodes) == 1))
            await ctl.step(T0, decide=True, before_decide=arrive)
            assert sorted(await placed()) == ["t0", "t1", "t2"]  # one GPU kept for inference
            sched = placer.feed.sched
            assert sched is not None and sched.period == "day"
            assert sched.reason_of("t3") == "Headroom"
            assert ctl.next_of("placer") == T0 + H  # it owes itself the switch to night
            # another participant may owe itself an instant before: each is stepped, and
            # nothing starts before the switch
            while (at := ctl.next_s()) is not None and at < T0 + H - 1:
                await ctl.step(at, decide=True)
            await ctl.step(T0 + H - 1, decide=True)  # 19:59:59, still day: nothing starts
            assert len(await placed()) == 3 and sched.period == "day"
            await ctl.step(T0 + H, decide=True)
            assert placer.feed.sched.period == "night"
            assert (await placed())["t3"] == T0 + H
    finally:
        code = await executor.close()
        await bus.close()
    assert code == 0
