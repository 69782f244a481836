"""Authentication and tenant isolation of the HTTP API, against the real gateway on a real
nats-server (the same in-process ``serve()`` shell as ``python -m services.gateway``).

What is asserted is what a stranger or a neighbour tenant can and cannot do: no token or a wrong
one gets 401, a tenant never sees (404, not 403) nor cancels another tenant's job, cannot submit
in another tenant's name or run a command unless allowed, cannot manage tenants; tokens live in
KV (hashed) and survive a gateway restart.
"""

from __future__ import annotations

import hashlib

import aiohttp

from libs.bus import Bus
from libs.policy.inventory import demo_cluster
from proto import subjects
from proto.ledger import Allocation
from proto.nodes import NodeSpec
from proto.tenants import TenantRecord
from tests.security.conftest import call, job
from tests.services._gateway_auth import ADMIN_TOKEN
from tests.services.test_gateway import gateway, until


async def add_tenant(
    http: aiohttp.ClientSession, base: str, name: str, *, may_run_commands: bool = False
) -> str:
    body = {"name": name, "may_run_commands": may_run_commands}
    status, data, _ = await call(http, "POST", f"{base}/v1/tenants", ADMIN_TOKEN, body)
    assert status == 201, data
    assert data["tenant"] == name and len(data["token"]) >= 43
    return data["token"]


async def test_no_token_or_a_wrong_one_is_401_with_a_bearer_challenge(nats_url, http):
    async with gateway(nats_url) as base:
        routes = [
            ("GET", "/v1/jobs"),
            ("POST", "/v1/jobs"),
            ("GET", "/v1/jobs/x"),
            ("GET", "/v1/jobs/x/events"),
            ("GET", "/v1/jobs/x/decisions"),
            ("DELETE", "/v1/jobs/x"),
            ("GET", "/v1/nodes"),
            ("GET", "/v1/tenants"),
            ("POST", "/v1/tenants"),
        ]
        for method, path in routes:
            body = job("x") if method == "POST" else None
            status, data, headers = await call(http, method, base + path, body=body)
            assert status == 401, (method, path, data)
            assert headers["WWW-Authenticate"].startswith("Bearer"), (method, path)
            assert "error" in data
            status, _, headers = await call(http, method, base + path, "not-a-token", body)
            assert status == 401, (method, path)
            assert 'error="invalid_token"' in headers["WWW-Authenticate"]
        for header in ("Basic YWRtaW46YWRtaW4=", "Bearer", f"Token {ADMIN_TOKEN}"):
            status, _, _ = await call(
                http, "GET", f"{base}/v1/jobs", headers={"Authorization": header}
            )
            assert status == 401, header
        # nothing was submitted by the refused POSTs
        status, data, _ = await call(http, "GET", f"{base}/v1/jobs", ADMIN_TOKEN)
        assert status == 200 and data["jobs"] == []
        # probes need no token
        status, data, _ = await call(http, "GET", f"{base}/healthz")
        assert status == 200 and data["status"] == "ok"


async def test_tenants_are_managed_by_the_admin_only(nats_url, http):
    async with gateway(nats_url) as base:
        a = await add_tenant(http, base, "team-a")
        status, data, _ = await call(http, "POST", f"{base}/v1/tenants", a, {"name": "evil"})
        assert status == 403 and "admin" in data["error"]
        for method, path in (("GET", "/v1/tenants"), ("DELETE", "/v1/tenants/team-a")):
            status, _, _ = await call(http, method, base + path, a)
            assert status == 403, (method, path)
        # a second create of a name does not replace the token someone holds
        again = {"name": "team-a"}
        status, _, _ = await call(http, "POST", f"{base}/v1/tenants", ADMIN_TOKEN, again)
        assert status == 409
        for bad in ({"name": "a b"}, {"name": ""}, {"name": "x", "admin": True}, {"nom": "x"}):
            status, data, _ = await call(http, "POST", f"{base}/v1/tenants", ADMIN_TOKEN, bad)
            assert status == 400, (bad, data)
        status, data, _ = await call(http, "GET", f"{base}/v1/tenants", ADMIN_TOKEN)
        assert status == 200
        assert [t["name"] for t in data["tenants"]] == ["team-a"]
        assert "token" not in str(data) and a not in str(data)  # neither token nor its hash


async def test_a_tenant_sees_and_cancels_only_its_own_jobs(nats_url, http):
    async with gateway(nats_url) as base:
        a = await add_tenant(http, base, "a")
        b = await add_tenant(http, base, "b")
        status, data, _ = await call(http, "POST", f"{base}/v1/jobs", a, job("a-1"))
        assert status == 201 and data["job"]["tenant"] == "a"
        status, data, _ = await call(http, "POST", f"{base}/v1/jobs", b, job("b-1"))
        assert status == 201 and data["job"]["tenant"] == "b"

        status, data, _ = await call(http, "GET", f"{base}/v1/jobs", a)
        assert status == 200 and [j["id"] for j in data["jobs"]] == ["a-1"]
        status, data, _ = await call(http, "GET", f"{base}/v1/jobs?tenant=b", a)
        assert status == 200 and data["jobs"] == []
        for path in ("/v1/jobs/b-1", "/v1/jobs/b-1/events", "/v1/jobs/b-1/decisions"):
            status, data, _ = await call(http, "GET", base + path, a)
            assert status == 404, path
            # the same answer as for an id that does not exist: nothing leaks
            _, ghost, _ = await call(http, "GET", base + path.replace("b-1", "b-9"), a)
            assert data["error"].replace("b-1", "b-9") == ghost["error"]
        status, _, _ = await call(http, "DELETE", f"{base}/v1/jobs/b-1", a)
        assert status == 404
        status, data, _ = await call(http, "GET", f"{base}/v1/jobs/b-1", b)
        assert status == 200 and data["state"] == "pending"  # not cancelled by A
        status, _, _ = await call(http, "GET", f"{base}/v1/jobs/a-1/events", a)
        assert status == 200

        # the admin sees both and filters by tenant
        status, data, _ = await call(http, "GET", f"{base}/v1/jobs", ADMIN_TOKEN)
        assert sorted(j["id"] for j in data["jobs"]) == ["a-1", "b-1"]
        status, data, _ = await call(http, "GET", f"{base}/v1/jobs?tenant=b", ADMIN_TOKEN)
        assert [j["id"] for j in data["jobs"]] == ["b-1"]
        status, _, _ = await call(http, "GET", f"{base}/v1/jobs/b-1/decisions", ADMIN_TOKEN)
        assert status == 200

        # B cancels its own job
        status, _, _ = await call(http, "DELETE", f"{base}/v1/jobs/b-1", b)
        assert status == 202


async def test_the_tenant_of_a_job_is_the_tokens_not_the_bodys(nats_url, http):
    async with gateway(nats_url) as base:
        a = await add_tenant(http, base, "a")
        b = await add_tenant(http, base, "b")
        status, data, _ = await call(http, "POST", f"{base}/v1/jobs", a, job("sneak", tenant="b"))
        assert status == 403 and data["errors"][0]["field"] == "tenant"
        status, data, _ = await call(http, "GET", f"{base}/v1/jobs", b)
        assert data["jobs"] == []  # B has no job it did not submit
        status, _, _ = await call(http, "GET", f"{base}/v1/jobs/sneak", ADMIN_TOKEN)
        assert status == 404  # and nothing was published
        # no tenant in the body (or the default one): the token's tenant
        for body in (job("plain"), job("dflt", tenant="default"), job("own", tenant="a")):
            status, data, _ = await call(http, "POST", f"{base}/v1/jobs", a, body)
            assert status == 201 and data["job"]["tenant"] == "a", body
            assert data["job"]["spec"]["tenant"] == "a"
        # B cannot take over, nor learn about, A's job id by submitting it
        status, data, _ = await call(http, "POST", f"{base}/v1/jobs", b, job("plain", gpus=2))
        assert status == 409 and "tenant" not in str(data) and "pending" not in str(data)
        status, data, _ = await call(http, "GET", f"{base}/v1/jobs/plain", ADMIN_TOKEN)
        assert data["tenant"] == "a" and data["gpus"] == 1
        # A resubmitting its own id is the usual idempotent duplicate
        status, data, _ = await call(http, "POST", f"{base}/v1/jobs", a, job("plain"))
        assert status == 200 and data["duplicate"] is True
        # the admin submits for any tenant
        status, data, _ = await call(
            http, "POST", f"{base}/v1/jobs", ADMIN_TOKEN, job("ops", tenant="b")
        )
        assert status == 201 and data["job"]["tenant"] == "b"
        status, data, _ = await call(http, "GET", f"{base}/v1/jobs", b)
        assert [j["id"] for j in data["jobs"]] == ["ops"]


async def test_commands_only_for_tenants_allowed_to_run_them(nats_url, http):
    async with gateway(nats_url) as base:
        plain = await add_tenant(http, base, "plain")
        trusted = await add_tenant(http, base, "trusted", may_run_commands=True)
        cmd = job("c-1", command="echo hi")
        status, data, _ = await call(http, "POST", f"{base}/v1/jobs", plain, cmd)
        assert status == 403 and [e["field"] for e in data["errors"]] == ["command"]
        status, _, _ = await call(http, "GET", f"{base}/v1/jobs/c-1", ADMIN_TOKEN)
        assert status == 404
        status, data, _ = await call(http, "POST", f"{base}/v1/jobs", plain, job("p-1"))
        assert status == 201  # the same tenant without a command is fine
        status, data, _ = await call(http, "POST", f"{base}/v1/jobs", trusted, cmd)
        assert status == 201 and data["job"]["spec"]["command"] == "echo hi"
        status, data, _ = await call(http, "GET", f"{base}/v1/tenants", ADMIN_TOKEN)
        allowed = {t["name"]: t["may_run_commands"] for t in data["tenants"]}
        assert allowed == {"plain": False, "trusted": True}


async def test_tokens_are_hashed_in_kv_and_survive_a_gateway_restart(nats_url, http):
    async with gateway(nats_url) as base:
        a = await add_tenant(http, base, "a")
        status, _, _ = await call(http, "POST", f"{base}/v1/jobs", a, job("a-1"))
        assert status == 201
    bus = await Bus.connect(nats_url, "test")
    try:
        entry = await (await bus.kv(subjects.KV_TENANTS, TenantRecord)).get("a")
        raw = await (await bus.js.key_value(subjects.KV_TENANTS)).get("a")
    finally:
        await bus.close()
    assert entry is not None and entry.value.token_sha256 == hashlib.sha256(a.encode()).hexdigest()
    assert a.encode() not in (raw.value or b"")  # only the hash is stored
    async with gateway(nats_url) as base:  # a new gateway: tenants from KV before serving
        status, data, _ = await call(http, "GET", f"{base}/v1/jobs", a)
        assert status == 200 and [j["id"] for j in data["jobs"]] == ["a-1"]


async def test_a_revoked_token_stops_working_on_every_gateway(nats_url, http):
    async with gateway(nats_url) as one, gateway(nats_url) as two:
        a = await add_tenant(http, one, "a")

        async def works_on_two() -> bool:
            return (await call(http, "GET", f"{two}/v1/jobs", a))[0] == 200

        await until(works_on_two, "a token made on one gateway works on the other")
        status, _, _ = await call(http, "DELETE", f"{one}/v1/tenants/a", ADMIN_TOKEN)
        assert status == 200
        status, _, _ = await call(http, "GET", f"{one}/v1/jobs", a)
        assert status == 401  # at once on the gateway that revoked it

        async def refused_on_two() -> bool:
            return (await call(http, "GET", f"{two}/v1/jobs", a))[0] == 401

        await until(refused_on_two, "the revocation reaches the other gateway")
        status, _, _ = await call(http, "DELETE", f"{one}/v1/tenants/a", ADMIN_TOKEN)
        assert status == 404


async def test_nodes_for_any_caller_with_a_token_but_only_its_own_job_ids(nats_url, http):
    bus = await Bus.connect(nats_url, "test")
    try:
        await bus.ensure_topology()
        node = demo_cluster()[0]
        await (await bus.kv(subjects.KV_NODES, NodeSpec)).put(node.id, node)
        async with gateway(nats_url) as base:
            a = await add_tenant(http, base, "a")
            b = await add_tenant(http, base, "b")
            for token, job_id in ((a, "a-1"), (b, "b-1")):
                status, _, _ = await call(http, "POST", f"{base}/v1/jobs", token, job(job_id))
                assert status == 201
            ledger = await bus.kv(subjects.KV_LEDGER, Allocation)
            for i, job_id in enumerate(("a-1", "b-1")):
                alloc = Allocation(
                    job_id=job_id, node=node.id, gpu_indices=(i,), gpu_share=1.0, gpu_mem_gb=8.0,
                    host_mem_gb=16.0, cpus=4.0, time=1.0,
                )  # fmt: skip
                await ledger.put(job_id, alloc)

            async def node_jobs(token: str) -> list[str] | None:
                status, data, _ = await call(http, "GET", f"{base}/v1/nodes", token)
                assert status == 200
                return data["nodes"][0]["jobs"] if data["nodes"] else None

            async def admin_sees_both() -> bool:
                return await node_jobs(ADMIN_TOKEN) == ["a-1", "b-1"]

            await until(admin_sees_both, "both allocations on the node")
            assert await node_jobs(a) == ["a-1"]
            status, data, _ = await call(http, "GET", f"{base}/v1/nodes", a)
            assert data["nodes"][0]["gpus_allocated"] == 2.0  # the load is not hidden

            # the dashboard: aggregate counts without a token, the caller's jobs with one
            status, page, _ = await call(http, "GET", f"{base}/")
            assert status == 200 and "pending: 2" in page
            assert "a-1" not in page and "b-1" not in page and node.id not in page
            status, page, _ = await call(http, "GET", f"{base}/", a)
            assert status == 200 and "a-1" in page and "b-1" not in page
            status, page, _ = await call(http, "GET", f"{base}/", ADMIN_TOKEN)
            assert "a-1" in page and "b-1" in page
    finally:
        await bus.close()


async def test_a_duplicate_id_the_read_model_does_not_show_is_retried_not_taken_over(
    nats_url, http
):
    """The bus already holds job id "held" (another gateway published it, then crashed before
    its Submitted could reach this gateway's read model). A tenant submitting that id must get
    "retry" (503), not a view made of its own copy, which would present it as the job's owner."""
    async with gateway(nats_url) as base:
        a = await add_tenant(http, base, "a")
        bus = await Bus.connect(nats_url, "test")
        try:
            # the other gateway's two publishes: the submission, and (with the Submitted's
            # message id) an event this gateway's read model never folds into a job
            await bus.publish_bytes(subjects.SUBJECT_SUBMIT, b"{}", msg_id="held")
            await bus.publish_bytes("lifecycle.elsewhere", b"{}", msg_id="submitted-held")
        finally:
            await bus.close()
        status, data, _ = await call(http, "POST", f"{base}/v1/jobs", a, job("held"))
        assert status == 503 and "retry" in data["error"], data
        status, _, _ = await call(http, "GET", f"{base}/v1/jobs/held", a)
        assert status == 404
