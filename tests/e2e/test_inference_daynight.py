"""The day/night switch with an inference service live (issue 16), on the stepped clock: the
real gateway (HTTP), placer and simulated executor on a real NATS server, the calendar on with
a day headroom of a quarter of the GPUs. At 19:00 (day) the service is defined over HTTP and
seven 1-GPU training jobs arrive on one 8-GPU node: the replica starts (inference is never held
off by the headroom), training fills the node only down to the headroom and the rest waits
with reason ``Headroom``, as ``GET /v1/jobs`` says; at 20:00, the configured switch to night
(the placer owes itself that instant), the waiting training jobs are placed at that very
instant and the node is full.

The weights in force switch at the hour too, as the live placer says them: a training job that
arrives at 19:59:59 waits (the headroom), and its wait decision (``mosaic explain``'s record)
carries the day's period and what it sets; one that arrives at 20:00 waits too (the node is
full) and its decision carries the night's, each equal to
``libs.policy.daynight.effective_policy`` at its side of the switch and to what ``mosaic
policy`` prints for that moment.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import msgspec
import pytest

from libs.bus import Bus
from libs.bus.server import free_port
from libs.bus.steps import StepController
from libs.client.cli_policy import in_force as policy_shown
from libs.clock import SteppedClock
from libs.policy.daynight import HEADROOM, effective_policy, in_force
from libs.policy_io.overrides import apply_overrides
from proto import subjects
from proto.events import Placed
from proto.inference import InferenceService
from proto.jobs import JobSpec
from services.executor.service import main as executor_main
from services.gateway.service import main as gateway_main
from services.placer.service import Placer
from tests.services._gateway_auth import ADMIN, admin_token_file
from tests.services._scorer_util import lifecycle_events, poll, put_nodes, start_in_process
from tests.services._stepped_placer import stepped_placer
from tests.services.test_gateway import _healthy
from tests.sim.helpers import node

H = 3600.0
T0 = 20 * 86_400.0 + 19 * H  # 19:00 UTC, day (the default day ends at 20:00)
SETS = ["calendar.enabled=true", "calendar.day.headroom_share=0.25", "power_saving=false"]
SERVICE = InferenceService(
    id="chat",
    replica=JobSpec(
        id="template",
        priority=8,
        gpus=1,
        gpu_mem_gb=8,
        kind="inference",
        workload_class="inference",
        latency_p99_ms=100.0,
        est_runtime_s=10 * H,
    ),
    rps_per_replica=100.0,
    min_replicas=1,
)


@pytest.fixture
async def live(nats_url: str, tmp_path) -> AsyncIterator[tuple[Bus, Placer, StepController, str]]:
    cfg, _ = apply_overrides(SETS)
    nodes = [node("n1", gpus=8)]
    bus = await Bus.connect(nats_url, "test")
    await bus.ensure_topology()
    await put_nodes(bus, nodes)
    port = free_port()
    services = [
        start_in_process(
            "gateway", gateway_main, nats_url, clock=SteppedClock(epoch=T0),
            http_host="127.0.0.1", http_port=port, admin_token_file=str(admin_token_file()),
        ),
        start_in_process(
            "executor", executor_main, nats_url, clock=SteppedClock(epoch=T0), mode="sim",
            node_spec=[msgspec.json.encode(n).decode() for n in nodes],
            log_dir=str(tmp_path / "logs"), report_interval=0.5, boot_s=cfg.resume_s,
            step_name="executor",
        ),
    ]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        async with stepped_placer(bus, nats_url, cfg, T0) as (placer, ctl):
            async with aiohttp.ClientSession(headers=ADMIN) as http:
                await poll(lambda: _healthy(http, base), timeout_s=30)
            await poll(lambda: asyncio.sleep(0, placer.active and len(placer.nodes) == 1))
            yield bus, placer, ctl, base
    finally:
        codes = [await s.close() for s in services]
        await bus.close()
    assert codes == [0, 0]


async def test_the_switch_to_night_gives_the_inference_headroom_to_training_at_the_hour(
    live: tuple[Bus, Placer, StepController, str],
) -> None:
    bus, placer, ctl, base = live
    jobs = [JobSpec(id=f"t{i}", gpus=1, gpu_mem_gb=8, est_runtime_s=10 * H) for i in range(7)]
    async with aiohttp.ClientSession(headers=ADMIN) as http:

        async def post(path: str, body: object) -> None:
            headers = {"Content-Type": "application/json"}
            data = msgspec.json.encode(body)
            async with http.post(f"{base}{path}", data=data, headers=headers) as r:
                assert r.status == 201, await r.text()

        async def arrive() -> None:
            await post("/v1/services", SERVICE)
            for spec in jobs:
                await post("/v1/jobs", spec)
            ids = {s.id for s in jobs}
            await poll(
                lambda: asyncio.sleep(
                    0, ids <= set(placer.tracker.specs) and "chat" in placer.service_defs
                ),
                timeout_s=20,
            )

        async def state() -> dict[str, tuple[str, str]]:
            async with http.get(f"{base}/v1/jobs") as r:
                body = await r.json()
            return {j["id"]: (j["state"], j["reason"]) for j in body["jobs"]}

        async def placed() -> dict[str, float]:
            events = await lifecycle_events(bus)
            return {e.job_id: e.time for e in events if isinstance(e, Placed)}

        await ctl.step(T0, decide=True, before_decide=arrive)
        await ctl.step(T0 + 1, decide=True)  # the executor has started what was placed
        by_day = await placed()
        replica = [j for j in by_day if j.startswith("chat-")]
        assert len(replica) == 1 and by_day[replica[0]] == T0  # inference: no headroom wait
        held = [s.id for s in jobs if s.id not in by_day]
        assert held and len(by_day) <= 8 - 1  # a GPU at least stays free for inference
        views = await poll(lambda: _views_show(state, replica[0], held), timeout_s=10)
        assert all(views[j] == ("pending", HEADROOM) for j in held)
        assert placer.feed.sched.period == "day"
        # the placer owes itself the switch to night, or first a backfill pass: when a pass at
        # T0 + 1 did not backfill and left jobs waiting (the cycles an arrival's events make
        # vary with the machine's load: 2 of 30 runs), the backfill is due an interval after
        # T0's (``cadence``), and after it the switch is owed
        backfill = T0 + placer.policy.backfill_interval_s
        assert ctl.next_of("placer") in (T0 + H, backfill)
        # another participant may owe itself an instant before (seen under load: T0 + 30 s);
        # each such instant is stepped, and nothing starts before the switch
        while (at := ctl.next_s()) is not None and at < T0 + H - 1:
            await ctl.step(at, decide=True)
        assert ctl.next_of("placer") == T0 + H
        assert len(await placed()) == len(by_day)
        await ctl.step(T0 + H - 1, decide=True, before_decide=lambda: post("/v1/jobs", LATE))
        assert len(await placed()) == len(by_day)  # 19:59:59, still day: nothing starts
        await ctl.step(T0 + H, decide=True, before_decide=lambda: post("/v1/jobs", NIGHT))
        assert placer.feed.sched.period == "night"
        at_night = await placed()
        assert {j: at_night[j] for j in held} == dict.fromkeys(held, T0 + H)
        assert len(at_night) == 8  # the node is full: seven trainers and the replica
    # the wait decisions of the jobs that came just before and at the switch
    waits = [*await _wait_decisions(bus, LATE.id), *await _wait_decisions(bus, NIGHT.id)]
    assert [d["time"] for d in waits] == [T0 + H - 1, T0 + H] and waits[0]["reason"] == HEADROOM
    cfg = placer.policy
    for d, period in zip(waits, ("day", "night"), strict=True):
        w = d["wait"]
        eff, want = effective_policy(cfg, d["time"])
        assert (w["period"], want) == (period, period)
        assert w["policy"] == pytest.approx(in_force(eff, w["regime"]))
        shown = policy_shown(cfg, d["time"], "at")  # what ``mosaic policy --time`` prints
        assert shown["period"] == period and shown["weights"][w["regime"]] == pytest.approx(
            {k[2:]: v for k, v in w["policy"].items() if k.startswith("w_") and k != "w_speed"}
        )
        assert {k: shown[k] for k in in_force(eff)} == pytest.approx(
            {k: w["policy"][k] for k in in_force(eff)}
        )
    day, night = waits[0]["wait"]["policy"], waits[1]["wait"]["policy"]
    changed = {k for k in day if day[k] != pytest.approx(night[k])}
    assert {"w_speed", "inference_boost", "training_boost", "headroom_share"} <= changed
    assert night["w_speed"] == pytest.approx(1.5 * day["w_speed"])  # throughput by night


LATE = JobSpec(id="late", gpus=1, gpu_mem_gb=8, est_runtime_s=10 * H)  # comes at 19:59:59
NIGHT = JobSpec(id="night", gpus=1, gpu_mem_gb=8, est_runtime_s=10 * H)  # comes at 20:00


async def _wait_decisions(bus: Bus, job: str) -> list[dict]:
    """The placer's wait decisions for ``job`` with their numbers, in stream order."""
    info = await bus.js.stream_info(subjects.STREAM_DECISIONS)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        d = msgspec.json.decode((await bus.js.get_msg(subjects.STREAM_DECISIONS, seq)).data)
        if d["action"] == "wait" and d["job_id"] == job and d.get("wait"):
            out.append(d)
    return out


async def _views_show(state, replica: str, held: list[str]) -> dict[str, tuple[str, str]] | None:
    """The gateway's jobs once it shows the replica running and the held jobs' reasons."""
    views = await state()
    ok = views.get(replica, ("", ""))[0] == "running" and all(
        views.get(j, ("", ""))[1] for j in held
    )
    return views if ok else None
