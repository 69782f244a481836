"""The admin's cordon routes: ``POST /v1/nodes/{id}/cordon`` and ``POST /v1/nodes/{id}/uncordon``.

Why the gateway writes the fact (KV ``cordons``, ``proto.cordons``) and the placer only reads it
(DESIGN rule 2): a cordon is the operator's word, and the operator speaks through the API, with
its token and its audit log. The gateway that answers also applies the change to its own nodes
model at once, so the next ``GET /v1/nodes`` shows it; every other replica learns it from the
watch (``follow``), as the placer does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web

from libs.bus.kv import TypedKV
from proto import subjects
from proto.cordons import MAX_REASON_CHARS, Cordon, CordonRequest, CordonState, is_cordoned
from proto.validation import FieldError
from services.gateway.auth import caller
from services.gateway.nodes_view import NodesModel
from services.gateway.responses import error_response, gateway_of, json_response

if TYPE_CHECKING:
    pass

MAX_BODY_BYTES = 4096
CORDON_ROUTE = "/v1/nodes/{id}/cordon"  # both in services.gateway.auth.ADMIN_ROUTES
UNCORDON_ROUTE = "/v1/nodes/{id}/uncordon"


async def follow(bus: Any, nodes: NodesModel) -> TypedKV[Cordon]:
    """Open KV ``cordons`` and feed every current and later value into ``nodes`` (returns once
    the current ones are in, so the first request already sees them)."""
    kv: TypedKV[Cordon] = await bus.kv(subjects.KV_CORDONS, Cordon)

    async def on_cordon(node_id: str, cordon: Cordon | None) -> None:
        nodes.put_cordon(node_id, cordon)

    await kv.watch(on_cordon)
    return kv


def parse_request(body: bytes) -> CordonRequest | list[FieldError]:
    """The cordon body, or every reason it is refused, each naming its field. An empty body is
    a cordon without a reason."""
    if not body.strip():
        return CordonRequest()
    if len(body) > MAX_BODY_BYTES:
        return [FieldError("body", f"over {MAX_BODY_BYTES} bytes")]
    try:
        raw = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        return [FieldError("body", f"not JSON: {exc}")]
    if not isinstance(raw, dict):
        return [FieldError("body", 'must be a JSON object such as {"reason": "..."}')]
    errors = [FieldError(str(k)[:64], "unknown field; only reason") for k in raw if k != "reason"]
    reason = raw.get("reason", "")
    if not isinstance(reason, str):
        errors.append(FieldError("reason", f"must be a string, got {type(reason).__name__}"))
    elif len(reason) > MAX_REASON_CHARS:
        errors.append(FieldError("reason", f"at most {MAX_REASON_CHARS} characters"))
    elif any(not c.isprintable() for c in reason):
        errors.append(FieldError("reason", "one line of printable text (no control characters)"))
    return errors or CordonRequest(reason=reason.strip())


def state(nodes: NodesModel, node_id: str) -> CordonState:
    """Whether ``node_id`` is cordoned now, by the operator's record or by a label."""
    spec = nodes.specs.get(node_id)
    label = spec is not None and is_cordoned(spec)
    c = nodes.cordons.get(node_id)
    if c is None:
        reason = nodes.cordon_reason(spec) if spec is not None else ""
        return CordonState(node=node_id, cordoned=label, label=label, reason=reason)
    return CordonState(
        node=node_id, cordoned=True, label=label, by=c.by, reason=c.reason, time=c.time
    )


def _refusal(request: web.Request, node_id: str, known: bool) -> web.Response | None:
    """403 for anyone but the admin (the auth middleware already says so; this is its second
    line), 404 for a node the gateway does not know."""
    who = caller(request)
    if who is None or not who.admin:
        return error_response(403, "cordon and uncordon are for the admin")
    if not known:
        return error_response(404, f"unknown node {node_id[:64]!r}")
    return None


async def cordon_node(request: web.Request) -> web.Response:
    """200 ``CordonState``. Cordoning a cordoned node replaces its reason (and time)."""
    gw = gateway_of(request)
    node_id = request.match_info["id"]
    if (refusal := _refusal(request, node_id, node_id in gw.nodes.specs)) is not None:
        return refusal
    parsed = parse_request(await request.read())
    if isinstance(parsed, list):
        return error_response(400, "invalid cordon request", parsed)
    who = caller(request)
    assert who is not None
    record = Cordon(node=node_id, by=who.name, reason=parsed.reason, time=gw.clock.now())
    await gw.cordons_kv.put(node_id, record)
    gw.nodes.put_cordon(node_id, record)
    gw.log.info("node_cordoned", node=node_id, by=who.name, reason=parsed.reason)
    return json_response(state(gw.nodes, node_id))


async def uncordon_node(request: web.Request) -> web.Response:
    """200 ``CordonState``; idempotent. A node that is gone from KV ``nodes`` but still has a
    cordon record may be uncordoned (to clean up); a label cordon stays (``label`` True)."""
    gw = gateway_of(request)
    node_id = request.match_info["id"]
    known = node_id in gw.nodes.specs or node_id in gw.nodes.cordons
    if (refusal := _refusal(request, node_id, known)) is not None:
        return refusal
    if node_id in gw.nodes.cordons:
        await gw.cordons_kv.delete(node_id)
        gw.nodes.put_cordon(node_id, None)
        who = caller(request)
        gw.log.info("node_uncordoned", node=node_id, by=who.name if who else "?")
    return json_response(state(gw.nodes, node_id))


def add_routes(app: web.Application) -> None:
    app.router.add_post(CORDON_ROUTE, cordon_node)
    app.router.add_post(UNCORDON_ROUTE, uncordon_node)
