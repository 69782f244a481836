"""The admin's tenant routes: ``POST``/``GET /v1/tenants``, ``DELETE /v1/tenants/{name}``.

Why the KV bucket is the truth and the gateway's ``Authenticator`` a cache fed by its watch: a
token made on one gateway must work on every replica and after a restart, and a revocation must
reach them all; the watch does both. The gateway that answers a create or a delete also applies
it at once, so the caller can use (or has lost) the token on the very next request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
from aiohttp import web

from libs.bus.errors import KeyExists
from proto.tenants import (
    TENANT_NAME,
    TenantCreate,
    TenantCreated,
    TenantList,
    TenantRecord,
    TenantView,
)
from proto.validation import FieldError
from services.gateway.auth import new_token, token_sha256
from services.gateway.responses import error_response, gateway_of, json_response

if TYPE_CHECKING:
    pass

MAX_BODY_BYTES = 4096
_create_decoder = msgspec.json.Decoder(TenantCreate)


async def create_tenant(request: web.Request) -> web.Response:
    """201 ``{"tenant", "token", "may_run_commands"}``; 409 when the name exists (a second
    create must not silently replace the token someone already holds)."""
    gw = gateway_of(request)
    body = await request.read()  # bounded by the app's client_max_size
    if len(body) > MAX_BODY_BYTES:
        return error_response(413, f"body over {MAX_BODY_BYTES} bytes")
    try:
        req = _create_decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return error_response(400, "invalid tenant", (FieldError("body", str(exc)),))
    if not TENANT_NAME.match(req.name):
        reason = "must be 1-64 characters of letters, digits, '-' or '_'"
        return error_response(400, "invalid tenant", (FieldError("name", reason),))
    token = new_token()
    record = TenantRecord(
        name=req.name,
        token_sha256=token_sha256(token),
        created_at=gw.clock.now(),
        may_run_commands=req.may_run_commands,
    )
    try:
        await gw.tenants_kv.create(req.name, record)
    except KeyExists:
        return error_response(
            409, f"tenant {req.name!r} exists; delete it first to issue a new token"
        )
    gw.auth.put(req.name, record)
    gw.log.info("tenant_created", tenant=req.name, may_run_commands=req.may_run_commands)
    return json_response(
        TenantCreated(tenant=req.name, token=token, may_run_commands=req.may_run_commands), 201
    )


async def list_tenants(request: web.Request) -> web.Response:
    """Every tenant, without its token (nor the hash: nothing here helps to impersonate)."""
    gw = gateway_of(request)
    views = [
        TenantView(name=r.name, created_at=r.created_at, may_run_commands=r.may_run_commands)
        for _, r in sorted(gw.auth.tenants.items())
    ]
    return json_response(TenantList(tenants=views))


async def delete_tenant(request: web.Request) -> web.Response:
    """Revoke the tenant's token. Its jobs stay (history; the admin still sees them)."""
    gw = gateway_of(request)
    name = request.match_info["name"]
    if name not in gw.auth.tenants or not TENANT_NAME.match(name):
        return error_response(404, f"unknown tenant {name!r}")
    await gw.tenants_kv.delete(name)
    gw.auth.put(name, None)
    gw.log.info("tenant_deleted", tenant=name)
    return json_response({"tenant": name, "status": "deleted"})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/tenants", create_tenant)
    app.router.add_get("/v1/tenants", list_tenants)
    app.router.add_delete("/v1/tenants/{name}", delete_tenant)
