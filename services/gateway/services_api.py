"""Inference services over HTTP: ``POST/GET /v1/services``, ``GET/DELETE /v1/services/{id}``.

Why the gateway owns the definition (KV ``services``, DESIGN rule 2, as cordons): a service is
an operator's or a tenant's word, said through the API with a token, checked here where the
caller still listens (``proto.inference.validate_service``, each error naming its field), then
written once; the placer only watches the bucket and scales (``services.placer.scaling``).

Who may: the admin any service; a tenant only services whose replicas are its own (a body
without ``replica.tenant`` gets the token's tenant; another tenant's is refused 403, as a job's
``tenant`` is), with a ``command`` only when the tenant may run commands; a tenant sees and
removes only its own, and another tenant's service id is in use (409) without a word about it.

What ``GET`` shows (``proto.service_views``): the definition, the live replicas from the jobs
read model (the placer's ``Submitted`` makes each a job), the newest sound load report from
``load.<service>``, and the scaler's last order's reason from the decisions stream.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web

from libs.bus.refusals import refused
from proto import subjects
from proto.decisions import Decision
from proto.inference import InferenceService, LoadReport, validate_report, validate_service
from proto.jobs import JobSpec
from proto.service_views import (
    SCALE_ACTIONS,
    ReplicaView,
    ServicesListing,
    ServiceView,
    service_of_replica,
)
from proto.validation import SERVICE_ID, FieldError
from proto.views import TERMINAL_STATES
from services.gateway.admission import never_fits
from services.gateway.auth import Principal, caller
from services.gateway.responses import error_response, gateway_of, json_response

if TYPE_CHECKING:
    from services.gateway.service import Gateway

MAX_BODY_BYTES = 64 * 1024  # a definition is a JobSpec and a few numbers
SERVICES_ROUTE = "/v1/services"
SERVICE_ROUTE = "/v1/services/{id}"
DEFAULT_TENANT = "default"
_FIELDS = set(InferenceService.__struct_fields__)
_REPLICA_FIELDS = set(JobSpec.__struct_fields__)
_decoder = msgspec.json.Decoder(InferenceService)


class ServicesModel:
    """The gateway's view of the services: definitions, newest reports, last scale orders."""

    def __init__(self) -> None:
        self.defs: dict[str, InferenceService] = {}
        self.reports: dict[str, LoadReport] = {}
        self.last: dict[str, tuple[str, float]] = {}  # service -> (reason, time) of its last order
        self.kv: Any = None

    async def follow(self, bus: Any) -> ServicesModel:
        """Watch KV ``services`` (the current ones first) and subscribe ``load.*``."""
        self.kv = await bus.kv(subjects.KV_SERVICES, InferenceService)

        async def on_service(key: str, svc: InferenceService | None) -> None:
            self.put(key, svc)

        async def on_load(received: tuple[str, LoadReport]) -> None:
            subject, report = received  # a report speaks for its own subject's service only
            if not refused(bus, "load_report", validate_report(report, subject)):
                self.report(report)

        await self.kv.watch(on_service)
        await bus.subscribe(subjects.LOAD_ALL, LoadReport, on_load, with_subject=True)
        return self

    def put(self, key: str, svc: InferenceService | None) -> None:
        if svc is None:
            self.defs.pop(key, None)
        else:
            self.defs[key] = svc

    def report(self, report: LoadReport) -> None:
        cur = self.reports.get(report.service)
        if cur is None or report.time >= cur.time:
            self.reports[report.service] = report

    def decision(self, d: Decision) -> None:
        """A placer decision: a scale order's record says why the service last moved."""
        if d.action in SCALE_ACTIONS and (sid := service_of_replica(d.job_id)):
            cur = self.last.get(sid)
            if cur is None or d.time >= cur[1]:
                self.last[sid] = (d.reason, d.time)

    @staticmethod
    def replicas(gw: Gateway) -> dict[tuple[str, str], list[ReplicaView]]:
        """(service, tenant) -> its live replicas, in one pass over the jobs read model."""
        out: dict[tuple[str, str], list[ReplicaView]] = {}
        for j in gw.jobs.list():
            if j.spec.service and j.state not in TERMINAL_STATES:
                view = ReplicaView(id=j.id, state=j.state, node=j.node, start_time=j.start_time)
                out.setdefault((j.spec.service, j.tenant), []).append(view)
        return out

    def view(
        self,
        gw: Gateway,
        svc: InferenceService,
        live: dict[tuple[str, str], list[ReplicaView]] | None = None,
    ) -> ServiceView:
        live = self.replicas(gw) if live is None else live
        replicas = tuple(live.get((svc.id, svc.replica.tenant), ()))
        reason, when = self.last.get(svc.id, ("", None))
        return ServiceView(
            service=svc,
            replicas=replicas,
            load=self.reports.get(svc.id),
            last_reason=reason,
            last_scaled_at=when,
        )


def parse_service(body: bytes) -> InferenceService | list[FieldError]:
    """The definition, or every reason it is refused, each naming its field (unknown fields
    are refused: a misspelt ``max_replica`` must not silently run the default)."""
    if len(body) > MAX_BODY_BYTES:
        return [FieldError("body", f"over {MAX_BODY_BYTES} bytes")]
    try:
        raw = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:
        return [FieldError("body", f"not JSON: {str(exc)[:200]}")]
    if not isinstance(raw, dict):
        return [FieldError("body", "must be a JSON object (an InferenceService)")]
    errors = [FieldError(str(k)[:64], "unknown field") for k in raw if k not in _FIELDS]
    replica = raw.get("replica")
    if isinstance(replica, dict):
        errors += [
            FieldError(f"replica.{str(k)[:64]}", "unknown field")
            for k in replica
            if k not in _REPLICA_FIELDS
        ]
    if errors:
        return errors
    try:
        svc = _decoder.decode(body)
    except msgspec.ValidationError as exc:
        m = re.search(r"at `\$\.([A-Za-z_.\[\]0-9]+)`", str(exc))
        return [FieldError(m.group(1) if m else "body", str(exc)[:300])]
    return validate_service(svc) or svc


def _as_caller(svc: InferenceService, who: Principal) -> InferenceService | web.Response:
    """The definition as the caller may make it (see the module docstring)."""
    replica = svc.replica
    if who.tenant is not None:
        if replica.tenant not in (who.tenant, DEFAULT_TENANT):
            why = f"this token defines services for tenant {who.tenant!r} only"
            return error_response(403, "tenant mismatch", [FieldError("replica.tenant", why)])
        replica = msgspec.structs.replace(replica, tenant=who.tenant)
    if replica.command is not None and not who.may_run_commands:
        why = f"tenant {who.name!r} may not run commands (an admin grants may_run_commands)"
        return error_response(403, "command not allowed", [FieldError("replica.command", why)])
    return msgspec.structs.replace(svc, replica=replica)


async def apply_service(request: web.Request) -> web.Response:
    """201 ``ServiceView`` for a new service, 200 for a redefinition; 400 naming each field."""
    gw = gateway_of(request)
    who = caller(request)
    if who is None:
        return error_response(401, "no caller")
    parsed = parse_service(await request.read())
    if isinstance(parsed, list):
        return error_response(400, "invalid service", parsed)
    svc = _as_caller(parsed, who)
    if isinstance(svc, web.Response):
        return svc
    nodes = list(gw.nodes.specs.values())
    refusal = never_fits(msgspec.structs.replace(svc.replica, id="probe"), nodes) if nodes else None
    if refusal is not None:
        return error_response(
            400, "invalid service", [FieldError(f"replica.{refusal.field}", refusal.reason)]
        )
    old = gw.services.defs.get(svc.id)
    if old is not None and not who.sees(old.replica.tenant):
        why = f"service id {svc.id!r} is in use; choose another"
        return error_response(409, "service id in use", [FieldError("id", why)])
    await gw.services.kv.put(svc.id, svc)
    gw.services.put(svc.id, svc)  # this replica answers reads at once; others by the watch
    gw.log.info("service_defined", service=svc.id, by=who.name, replaced=old is not None)
    return json_response(gw.services.view(gw, svc), 200 if old is not None else 201)


def _visible(request: web.Request, sid: str) -> InferenceService | None:
    svc = gateway_of(request).services.defs.get(sid)
    who = caller(request)
    return svc if svc is not None and who is not None and who.sees(svc.replica.tenant) else None


async def list_services(request: web.Request) -> web.Response:
    gw = gateway_of(request)
    who = caller(request)
    live = gw.services.replicas(gw)
    shown = [
        gw.services.view(gw, svc, live)
        for _, svc in sorted(gw.services.defs.items())
        if who is not None and who.sees(svc.replica.tenant)
    ]
    return json_response(ServicesListing(services=tuple(shown)))


async def get_service(request: web.Request) -> web.Response:
    sid = request.match_info["id"]
    svc = _visible(request, sid)
    if svc is None:
        return error_response(404, f"unknown service {sid[:64]!r}")
    gw = gateway_of(request)
    return json_response(gw.services.view(gw, svc))


async def remove_service(request: web.Request) -> web.Response:
    """200; the placer stops every replica (each ends Cancelled, "scaled down: ...")."""
    sid = request.match_info["id"]
    if not SERVICE_ID.fullmatch(sid) or _visible(request, sid) is None:
        return error_response(404, f"unknown service {sid[:64]!r}")
    gw = gateway_of(request)
    await gw.services.kv.delete(sid)
    gw.services.put(sid, None)
    who = caller(request)
    gw.log.info("service_removed", service=sid, by=who.name if who else "?")
    return json_response({"service": sid, "status": "deleted"})


def add_routes(app: web.Application) -> None:
    app.router.add_post(SERVICES_ROUTE, apply_service)
    app.router.add_get(SERVICES_ROUTE, list_services)
    app.router.add_get(SERVICE_ROUTE, get_service)
    app.router.add_delete(SERVICE_ROUTE, remove_service)
