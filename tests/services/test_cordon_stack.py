"""Cordons end to end on a real nats-server (issue 13): the gateway's HTTP routes write KV
``cordons``, the real scorer ranks, the real placer reads the cordons and a stand-in executor
runs what is placed. A job that only a cordoned node can hold waits (reason ``Cordoned``) while
the others land elsewhere, and is placed once the node is uncordoned; a label cordon is
honoured the same way; the routes refuse strangers, tenants, unknown nodes and bad bodies."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import msgspec
import pytest

from libs.bus import Bus
from libs.clock import Clock
from libs.obs.logging import get_logger
from libs.obs.tracing import setup_tracing
from proto import subjects
from proto.cordons import Cordon, CordonState
from proto.events import Completed, Placed
from proto.jobs import JobSpec
from proto.nodes import NodeSpec
from proto.views import ErrorResponse, NodeView
from services.placer.service import Placer, PlacerSettings
from services.scorer.service import main as scorer_main
from tests.services._gateway_auth import ADMIN
from tests.services._placer_executor import FakeExecutor
from tests.services._scorer_util import by_job, lifecycle_events, poll, put_nodes, start_in_process
from tests.services.test_gateway import gateway
from tests.services.test_placer import FAST, small_cluster

JSON = {"Content-Type": "application/json"}
V100, T4 = (n.id for n in small_cluster())  # 4 x 32 GB and 4 x 16 GB


@asynccontextmanager
async def running_placer(url: str) -> AsyncIterator[Placer]:
    """A placer object (so a test can read its cordons and waiting reasons), holding the lease."""
    bus = await Bus.connect(url, "placer")
    settings = PlacerSettings(holder="cordon-test", **FAST)
    p = Placer(bus, Clock.from_env(), get_logger(service="placer"), setup_tracing("p"), settings)
    await p.start()
    stop = asyncio.Event()
    task = asyncio.create_task(p.run(stop))
    try:
        yield p
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        await bus.close()


@pytest.fixture
async def stack(nats_url: str, bus: Bus) -> AsyncIterator[tuple[str, Placer, FakeExecutor]]:
    """Nodes in KV, a gateway (base URL), the scorer, a placer and the stand-in executor."""
    await put_nodes(bus, small_cluster())
    executor = FakeExecutor(bus, run_s=0.3)
    await executor.start()
    scorer = start_in_process("scorer", scorer_main, nats_url, rescore_s=1.0, debounce_s=0.05)
    try:
        async with gateway(nats_url) as base, running_placer(nats_url) as placer:
            await poll(lambda: asyncio.sleep(0, placer.active))
            yield base, placer, executor
    finally:
        assert await scorer.close() == 0
        await executor.close()


async def _post(http: aiohttp.ClientSession, url: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else body if isinstance(body, bytes) else msgspec.json.encode(body)
    async with http.post(url, data=data, headers=JSON if data is not None else {}) as r:
        return r.status, await r.read()


async def _nodes(http: aiohttp.ClientSession, base: str) -> dict[str, NodeView]:
    async with http.get(f"{base}/v1/nodes") as r:
        views = msgspec.json.decode(await r.read(), type=dict[str, list[NodeView]])["nodes"]
    return {v.spec.id: v for v in views}


async def _submit(http: aiohttp.ClientSession, base: str, spec: JobSpec) -> None:
    status, body = await _post(http, f"{base}/v1/jobs", spec)
    assert status == 201, body


async def _placements(bus: Bus) -> dict[str, list[str]]:
    """Job -> the nodes of its Placed events, and "done" once it completed."""
    out: dict[str, list[str]] = {}
    for job, evs in by_job(await lifecycle_events(bus)).items():
        out[job] = [e.node for e in evs if isinstance(e, Placed)]
        out[job] += ["done"] if any(isinstance(e, Completed) for e in evs) else []
    return out


async def _waits_cordoned(http: aiohttp.ClientSession, base: str, placer: Placer, job: str):
    """The job waits with the reason Cordoned: in the placer and in ``mosaic explain``."""
    await poll(lambda: asyncio.sleep(0, "Cordoned" in placer.waiting.get(job, "")))
    async with http.get(f"{base}/v1/jobs/{job}/decisions") as r:
        decisions = (await r.json())["decisions"]
    return [d for d in decisions if d["action"] == "wait" and "Cordoned" in d["reason"]]


# a job only the V100 can hold (24 GB per GPU), and small ones either node could. Ten minutes:
# below the slow-GPU guard (slow_guard_runtime_s), which would hold an hour-long job off the T4
# while it waits for the faster V100 - even a cordoned one (its "present" models are static)
BIG = JobSpec(id="big", gpus=1, gpu_mem_gb=24, host_mem_gb=8, est_runtime_s=600)
SMALL = [
    JobSpec(id=f"small-{i}", gpus=1, gpu_mem_gb=4, host_mem_gb=4, est_runtime_s=600)
    for i in range(3)
]


async def test_cordon_over_http_keeps_new_work_off_the_node_until_uncordoned(stack, bus, http):
    base, placer, _ = stack
    await poll(lambda: _nodes(http, base))
    status, body = await _post(http, f"{base}/v1/nodes/{V100}/cordon", {"reason": "bad fan"})
    assert status == 200, body
    state = msgspec.json.decode(body, type=CordonState)
    assert (state.cordoned, state.by, state.reason, state.label) == (
        True,
        "admin",
        "bad fan",
        False,
    )
    record = await (await bus.kv(subjects.KV_CORDONS, Cordon)).get(V100)
    assert record is not None and record.value.reason == "bad fan" and record.value.by == "admin"
    await poll(lambda: asyncio.sleep(0, V100 in placer.cordons.ids(placer.nodes.values())))
    view = (await _nodes(http, base))[V100]
    assert view.cordoned and view.cordon_reason == "bad fan"
    assert not (await _nodes(http, base))[T4].cordoned

    for spec in [BIG, *SMALL]:
        await _submit(http, base, spec)
    done = await poll(lambda: _all_small_done(bus), timeout_s=30)
    assert all(done[s.id] == [T4, "done"] for s in SMALL), done  # none on the cordoned V100
    assert await _waits_cordoned(http, base, placer, "big")
    await asyncio.sleep(4 * FAST["tick_s"])  # several more cycles: still not placed
    assert (await _placements(bus)).get("big", []) == []

    status, body = await _post(http, f"{base}/v1/nodes/{V100}/uncordon")
    assert status == 200 and not msgspec.json.decode(body, type=CordonState).cordoned
    assert await (await bus.kv(subjects.KV_CORDONS, Cordon)).get(V100) is None
    got = await poll(lambda: _done(bus, "big"), timeout_s=20)
    assert got == [V100, "done"]
    assert not (await _nodes(http, base))[V100].cordoned


async def _all_small_done(bus: Bus) -> dict[str, list[str]]:
    got = await _placements(bus)
    return got if all("done" in got.get(s.id, []) for s in SMALL) else {}


async def _done(bus: Bus, job: str) -> list[str]:
    got = (await _placements(bus)).get(job, [])
    return got if "done" in got else []


async def test_a_label_cordon_is_honoured_and_outlives_an_api_uncordon(stack, bus, http):
    base, placer, _ = stack
    nodes_kv = await bus.kv(subjects.KV_NODES, NodeSpec)
    v100 = next(n for n in small_cluster() if n.id == V100)
    await nodes_kv.put(V100, msgspec.structs.replace(v100, labels={"mosaic/cordoned": "true"}))
    await poll(lambda: asyncio.sleep(0, V100 in placer.cordons.ids(placer.nodes.values())))
    await poll(lambda: _cordoned_in_view(http, base))
    await _submit(http, base, BIG)
    assert await _waits_cordoned(http, base, placer, "big")
    # the API cannot lift a label: the answer says the node is still cordoned, by its label
    status, body = await _post(http, f"{base}/v1/nodes/{V100}/uncordon")
    state = msgspec.json.decode(body, type=CordonState)
    assert status == 200 and state.cordoned and state.label and state.by == ""
    await asyncio.sleep(4 * FAST["tick_s"])
    assert (await _placements(bus)).get("big", []) == []
    await nodes_kv.put(V100, v100)  # the node's agent drops the label
    assert await poll(lambda: _done(bus, "big"), timeout_s=20) == [V100, "done"]


async def _cordoned_in_view(http: aiohttp.ClientSession, base: str) -> bool:
    view = (await _nodes(http, base)).get(V100)
    return view is not None and view.cordoned and "mosaic/cordoned" in view.cordon_reason


async def test_the_cordon_routes_refuse_strangers_tenants_unknown_nodes_and_bad_bodies(
    nats_url, bus
):
    await put_nodes(bus, small_cluster())
    cordons = await bus.kv(subjects.KV_CORDONS, Cordon)
    async with gateway(nats_url) as base, aiohttp.ClientSession(headers=ADMIN) as admin:
        await poll(lambda: _nodes(admin, base))
        url = f"{base}/v1/nodes/{V100}/cordon"
        status, body = await _post(admin, f"{base}/v1/tenants", {"name": "ml"})
        tenant_token = msgspec.json.decode(body)["token"]
        async with aiohttp.ClientSession() as anon:
            assert (await _post(anon, url))[0] == 401
            assert (await _post(anon, f"{base}/v1/nodes/{V100}/uncordon"))[0] == 401
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer wrong"}) as bad:
            assert (await _post(bad, url))[0] == 401
        tenant = {"Authorization": f"Bearer {tenant_token}"}
        async with aiohttp.ClientSession(headers=tenant) as ml:
            assert (await _post(ml, url, {"reason": "mine now"}))[0] == 403
            assert (await _post(ml, f"{base}/v1/nodes/{V100}/uncordon"))[0] == 403
        for path in ("/v1/nodes/nope/cordon", "/v1/nodes/nope/uncordon"):
            status, body = await _post(admin, base + path)
            assert status == 404 and "nope" in msgspec.json.decode(body, type=ErrorResponse).error
        for bad_body, field in ((b'{"reason": 7}', "reason"), (b'{"why": "x"}', "why")):
            status, body = await _post(admin, url, bad_body)
            err = msgspec.json.decode(body, type=ErrorResponse)
            assert status == 400 and [e.field for e in err.errors] == [field], body
        async with admin.post(url, data=b"reason=x", headers={"Content-Type": "text/plain"}) as r:
            assert r.status == 415
        assert await cordons.items() == {}  # nothing refused was written
        assert not (await _nodes(admin, base))[V100].cordoned
        status, body = await _post(admin, url)  # no body at all: a cordon without a reason
        assert status == 200 and msgspec.json.decode(body, type=CordonState).cordoned
        assert (await cordons.get(V100)).value.reason == ""  # type: ignore[union-attr]
        assert (await _nodes(admin, base))[V100].cordon_reason == "cordoned by admin"
