"""``/v1/services`` on a real nats-server with the real gateway (issue 16): a definition lands
in KV ``services`` (the placer's input) only when sound, refusals name the field; a tenant
defines, sees and removes only its own services; the listing shows the newest sound load
report and the scaler's last reason from the placer's decisions."""

from __future__ import annotations

import asyncio

import aiohttp
import msgspec

from libs.bus import Bus
from libs.client.cli import main
from proto import subjects
from proto.decisions import Decision
from proto.inference import InferenceService, LoadReport
from proto.jobs import JobSpec
from proto.service_views import SCALE_UP, ServicesListing, ServiceView
from tests.services._gateway_auth import ADMIN, ADMIN_TOKEN
from tests.services._scorer_util import poll, put_nodes
from tests.services.test_gateway import gateway
from tests.services.test_placer import small_cluster

JSON = {"Content-Type": "application/json"}
REPLICA = JobSpec(
    id="template", priority=8, gpus=1, gpu_mem_gb=8, kind="inference",
    workload_class="inference", latency_p99_ms=100.0,
)  # fmt: skip
SVC = InferenceService(id="chat", replica=REPLICA, rps_per_replica=100.0)


async def test_services_are_defined_scoped_and_shown(nats_url: str, bus: Bus) -> None:
    await put_nodes(bus, small_cluster())
    async with gateway(nats_url) as base, aiohttp.ClientSession() as http:

        async def call(method: str, path: str, who: dict, body: object = None) -> tuple:
            data = None if body is None else msgspec.json.encode(body)
            async with http.request(
                method, f"{base}{path}", data=data, headers={**JSON, **who}
            ) as r:
                return r.status, await r.read()

        status, raw = await call("POST", "/v1/tenants", ADMIN, {"name": "acme"})
        acme = {"Authorization": f"Bearer {msgspec.json.decode(raw)['token']}"}
        status, raw = await call("POST", "/v1/services", acme, SVC)
        assert status == 201, raw
        made = msgspec.json.decode(raw, type=ServiceView)
        assert made.service.replica.tenant == "acme"  # the token's tenant
        kv = await bus.kv(subjects.KV_SERVICES, InferenceService)
        stored = await kv.get("chat")
        assert stored is not None and stored.value.replica.tenant == "acme"
        # refusals, each naming the field; nothing written
        too_big = msgspec.structs.replace(REPLICA, gpus=64)
        for body, field, code in (
            (msgspec.structs.replace(SVC, id="other", replica=too_big), "replica.gpus", 400),
            (b"[1, 2]", "body", 400),
            ({**msgspec.to_builtins(SVC), "id": "x", "replica": {"gpu": 1}}, "replica.gpu", 400),
            (msgspec.structs.replace(SVC, id="theirs", replica=REPLICA), "replica.tenant", 403),
        ):
            data = body if isinstance(body, bytes) else msgspec.to_builtins(body)
            if field == "replica.tenant":
                data["replica"]["tenant"] = "globex"
            status, raw = await call("POST", "/v1/services", acme, data)
            fields = [e["field"] for e in msgspec.json.decode(raw)["errors"]]
            assert status == code and field in fields, (field, raw)
        assert sorted(await kv.items()) == ["chat"]
        # a job cannot pass for a replica: only the scaler makes those
        fake = msgspec.structs.replace(REPLICA, id="fake-1", service="chat", tenant="acme")
        status, raw = await call("POST", "/v1/jobs", acme, fake)
        assert status == 400 and "service" in [
            e["field"] for e in msgspec.json.decode(raw)["errors"]
        ]
        # another tenant neither sees, overwrites nor removes it
        status, raw = await call("POST", "/v1/tenants", ADMIN, {"name": "globex"})
        globex = {"Authorization": f"Bearer {msgspec.json.decode(raw)['token']}"}
        status, raw = await call("GET", "/v1/services", globex)
        assert msgspec.json.decode(raw, type=ServicesListing).services == ()
        assert (await call("POST", "/v1/services", globex, SVC))[0] == 409
        assert (await call("DELETE", "/v1/services/chat", globex))[0] == 404
        # the listing: the newest sound report, the scaler's last reason
        for rps in (-1.0, 120.0):  # the unsound one is ignored
            report = LoadReport(service="chat", time=100.0, rps=rps)
            await bus.nc.publish(subjects.load("chat"), msgspec.json.encode(report))
        await bus.publish(
            subjects.decisions("placer"),
            Decision(
                job_id="chat-186a0-0",
                time=100.0,
                action=SCALE_UP,
                service="placer",
                reason="chat: up: 120 req/s on 1 serving (1.20 of capacity)",
            ),
            msg_id="decision-scale_up-chat-186a0-0",
        )

        async def shown() -> ServiceView | None:
            _, raw = await call("GET", "/v1/services/chat", ADMIN)
            view = msgspec.json.decode(raw, type=ServiceView)
            return view if view.load is not None and view.last_reason else None

        view = await poll(shown, timeout_s=10)
        assert view.load.rps == 120.0 and view.last_reason.startswith("chat: up:")
        assert (await call("DELETE", "/v1/services/chat", acme))[0] == 200
        await poll(lambda: _gone(kv), timeout_s=5)


async def _gone(kv) -> bool:  # type: ignore[no-untyped-def]
    await asyncio.sleep(0)
    return await kv.get("chat") is None


async def test_the_service_commands_drive_the_api(
    nats_url: str, bus: Bus, tmp_path, capsys, monkeypatch
) -> None:
    """``mosaic service apply FILE``, ``mosaic services``, ``mosaic service rm ID``; a bad
    file is one line naming the field, exit 1."""
    for var in ("MOSAIC_TOKEN", "MOSAIC_TOKEN_FILE", "MOSAIC_GATEWAY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MOSAIC_DATA_DIR", str(tmp_path / "no-stack"))
    monkeypatch.setenv("COLUMNS", "200")
    await put_nodes(bus, small_cluster())
    good, bad = tmp_path / "chat.json", tmp_path / "bad.json"
    good.write_bytes(msgspec.json.encode(SVC))
    bad.write_bytes(msgspec.json.encode({**msgspec.to_builtins(SVC), "max_replicas": -1}))

    async def mosaic(*args: str) -> int:
        return await asyncio.to_thread(main, ["--token", ADMIN_TOKEN, *args])

    async with gateway(nats_url) as base:
        assert await mosaic("service", "apply", str(good), "--gateway", base) == 0
        assert capsys.readouterr().out.strip() == "chat: 1-8 replicas, 100 req/s each"
        assert await mosaic("services", "--gateway", base) == 0
        rows = capsys.readouterr().out.splitlines()
        assert rows[0].split()[:3] == ["SERVICE", "TENANT", "REPLICAS"]
        assert rows[1].split()[:4] == ["chat", "default", "0/0", "1-8"]
        assert await mosaic("service", "apply", str(bad), "--gateway", base) == 1
        assert "max_replicas" in capsys.readouterr().err
        assert await mosaic("service", "rm", "chat", "--gateway", base) == 0
        assert capsys.readouterr().out.strip() == "chat: removed"
        assert await mosaic("service", "rm", "chat", "--gateway", base) == 1
