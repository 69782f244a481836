"""The HTTP API of ``docs/runtime-contract.md``: routes, JSON encoding, request spans and metrics.

Why a thin layer: each handler parses the request, asks the ``Gateway`` (which owns the bus and
the read models) and encodes a ``proto.views`` Struct - the same Structs the CLI decodes - so the
contract lives in ``proto`` and nothing here invents a shape of its own.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web
from opentelemetry.trace import SpanKind, Status, StatusCode
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from proto.jobs import JobSpec
from proto.validation import MAX_COMMAND_BYTES, FieldError, JobRejected
from proto.views import TERMINAL_STATES, ErrorResponse, JobView, NodeView, SubmitResponse
from services.gateway import (
    cordon_api,
    dashboard,
    metrics,
    profiles_api,
    public_page,
    services_api,
    tenants,
)
from services.gateway.admission import admit, parse
from services.gateway.auth import Principal, caller, middleware
from services.gateway.httpserver import ConnectionGuard, HttpTimeouts
from services.gateway.jobs_view import encode_events

if TYPE_CHECKING:
    from services.gateway.service import Gateway

GATEWAY_KEY: web.AppKey[Gateway] = web.AppKey("gateway")
GUARD_KEY: web.AppKey[ConnectionGuard] = web.AppKey("connection_guard")
MAX_BODY_BYTES = 1 << 20  # a request body; a job itself is bounded far lower (MAX_JOB_BYTES)
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
JOB_STATES = ("pending", "placed", "running", "completed", "failed", "cancelled")
DEFAULT_TENANT = "default"  # JobSpec's default: what a body without ``tenant`` decodes to
_encoder = msgspec.json.Encoder()


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=_encoder.encode(obj), status=status, content_type="application/json")


def error(status: int, message: str, errors: list[FieldError] | tuple[()] = ()) -> web.Response:
    return json_response(ErrorResponse(error=message, errors=tuple(errors)), status)


def _route_name(request: web.Request) -> str:
    """The route pattern (``/v1/jobs/{id}``), never the concrete path: bounded label values."""
    info = request.match_info.route.resource
    return info.canonical if info is not None else "unmatched"


@web.middleware
async def observe(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every request in an OpenTelemetry span (messages published inside carry its context)
    and in the latency histogram."""
    gw = request.app[GATEWAY_KEY]
    route = _route_name(request)
    started = time.perf_counter()
    status = 500
    with gw.tracer.start_as_current_span(
        f"{request.method} {route}",
        kind=SpanKind.SERVER,
        attributes={"http.request.method": request.method, "http.route": route},
    ) as span:
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        except Exception as exc:
            span.record_exception(exc)
            gw.log.exception("http_error", route=route, method=request.method)
            return error(500, f"internal error: {type(exc).__name__}")
        finally:
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR))
            metrics.HTTP_SECONDS.labels(route, request.method, str(status)).observe(
                time.perf_counter() - started
            )


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """aiohttp's own refusals (404, 405, 413...) as the same JSON ``ErrorResponse`` as ours,
    with a message that says what to change. Why: a client decodes one error shape, and
    bad input must never fall through to ``observe``'s 500."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        resp = error(exc.status, _refusal_message(request, exc))
        if "Allow" in exc.headers:
            resp.headers["Allow"] = exc.headers["Allow"]
        return resp


def _refusal_message(request: web.Request, exc: web.HTTPException) -> str:
    path = request.path if len(request.path) <= 200 else request.path[:200] + "..."
    if exc.status == 404:
        return f"no such route: {path}"
    if exc.status == 405:
        allowed = exc.headers.get("Allow", "")
        return f"method {request.method} not allowed on {path} (allowed: {allowed})"
    if exc.status == 413:
        return (
            f"request body over {MAX_BODY_BYTES} bytes "
            f"(a job's command may be at most {MAX_COMMAND_BYTES} bytes)"
        )
    return exc.reason


@web.middleware
async def require_json(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """A request body must say ``Content-Type: application/json`` (UTF-8), else 415.

    Why: a browser sends a cross-origin ``text/plain`` form post without asking first; refusing
    every other type stops such posts from acting. A bodiless POST passes (nothing to decode).
    """
    if request.method in _BODY_METHODS and request.body_exists:
        charset = (request.charset or "utf-8").lower()
        if request.content_type != "application/json" or charset not in ("utf-8", "utf8"):
            sent = request.headers.get("Content-Type", "none")[:100]
            return error(415, f"Content-Type must be application/json (UTF-8), got {sent!r}")
    return await handler(request)


async def submit(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    now = gw.clock.now()
    try:
        spec = parse(await request.read(), now=now)
    except JobRejected as exc:
        metrics.SUBMISSIONS.labels("refused").inc()
        return error(400, "invalid job", exc.errors)
    who = caller(request)
    assert who is not None  # the auth middleware lets no anonymous caller reach this route
    spec, refusal = _as_caller(spec, who)
    if refusal is not None:
        metrics.SUBMISSIONS.labels("refused").inc()
        return refusal
    existing = gw.jobs.get(spec.id)
    if existing is not None and not who.sees(existing.tenant):
        metrics.SUBMISSIONS.labels("refused").inc()
        return _id_taken(spec.id)
    if existing is not None:  # known: answer without publishing anything
        metrics.SUBMISSIONS.labels("duplicate").inc()
        return json_response(SubmitResponse(job=existing, duplicate=True), 200)
    errs = admit(spec, now=now, nodes=gw.nodes.cluster()) or _fits_bus(gw, spec)
    if errs:
        metrics.SUBMISSIONS.labels("refused").inc()
        gw.log.info("job_refused", job_id=spec.id, errors=[f"{e.field}: {e.reason}" for e in errs])
        return error(400, "invalid job", errs)
    try:  # the job's trace starts here: every later decision about it hangs under this span
        attrs = {"job": spec.id, "tenant": spec.tenant, "gpus": spec.gpus}
        with gw.tracer.start_as_current_span("gateway.submit", attributes=attrs):
            view, duplicate = await gw.submit(spec)
    except Exception as exc:  # the bus is down or slow: nothing is lost, the id makes a retry safe
        metrics.SUBMISSIONS.labels("unavailable").inc()
        return _unavailable(gw, "submit", spec.id, exc)
    if not who.sees(view.tenant):  # the bus knew the id before our read model did
        return _id_taken(spec.id)
    metrics.SUBMISSIONS.labels("duplicate" if duplicate else "accepted").inc()
    return json_response(SubmitResponse(job=view, duplicate=duplicate), 200 if duplicate else 201)


def _as_caller(spec: JobSpec, who: Principal) -> tuple[JobSpec, web.Response | None]:
    """The job as the caller may submit it: a tenant's job is the token's tenant's (a body
    naming another tenant is refused, 403, rather than silently rewritten: a client that
    believes it submits for someone else has a bug or an intent worth telling); the admin
    submits for any tenant. A ``command`` needs a tenant allowed to run commands."""
    if who.tenant is not None:
        if spec.tenant not in (who.tenant, DEFAULT_TENANT):
            reason = f"this token submits for tenant {who.tenant!r} only"
            return spec, error(403, "tenant mismatch", [FieldError("tenant", reason)])
        spec = msgspec.structs.replace(spec, tenant=who.tenant)
    if spec.command is not None and not who.may_run_commands:
        reason = f"tenant {who.name!r} may not run commands (an admin grants may_run_commands)"
        return spec, error(403, "command not allowed", [FieldError("command", reason)])
    return spec, None


def _id_taken(job_id: str) -> web.Response:
    """Job ids are one namespace (they dedupe on the bus): another tenant's id is refused
    without saying anything about that job."""
    reason = f"job id {job_id!r} is already in use; choose another or omit it"
    return error(409, "job id in use", [FieldError("id", reason)])


def _visible_job(request: web.Request, job_id: str) -> JobView | None:
    """The job if the caller may see it; another tenant's job is as unknown as a missing one
    (404, not 403), so ids do not leak."""
    view = request.app[GATEWAY_KEY].jobs.get(job_id)
    who = caller(request)
    if view is None or who is None or not who.sees(view.tenant):
        return None
    return view


def _fits_bus(gw: Gateway, spec: JobSpec) -> list[FieldError]:
    """A job whose messages would exceed the server's max payload, refused at the edge: NATS
    would refuse the publish, and nats-py answers that by closing the connection. The bounds
    of ``proto.validation`` keep a job far below the 1 MiB default; this covers a server
    configured with less. Half the payload: the ``Submitted`` event and headers come on top."""
    limit = int(getattr(gw.bus.nc, "max_payload", 0) or 0)
    size = len(_encoder.encode(spec))
    if limit and size > limit // 2:
        reason = f"encodes to {size} bytes; this bus takes jobs up to {limit // 2} bytes"
        return [FieldError("command" if spec.command else "job", reason)]
    return []


def _unavailable(gw: Gateway, action: str, job_id: str, exc: Exception) -> web.Response:
    gw.log.warning("publish_failed", action=action, job_id=job_id, error=repr(exc))
    return error(
        503,
        f"could not {action} job {job_id!r}: the bus did not answer ({type(exc).__name__}); "
        "retry with the same id",
    )


async def list_jobs(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    state = request.query.get("state") or None
    tenant = request.query.get("tenant") or None
    who = caller(request)
    assert who is not None
    if who.tenant is not None:  # a tenant lists its own jobs, whatever it filters on
        if tenant not in (None, who.tenant):
            return json_response({"jobs": []})
        tenant = who.tenant
    if state is not None and state not in JOB_STATES:
        return error(
            400,
            "invalid filter",
            [FieldError("state", f"unknown state {state!r}; one of {', '.join(JOB_STATES)}")],
        )
    return json_response({"jobs": gw.jobs.list(state=state, tenant=tenant)})


async def get_job(request: web.Request) -> web.Response:
    job_id = request.match_info["id"]
    view = _visible_job(request, job_id)
    if view is None:
        return error(404, f"unknown job {job_id!r}")
    return json_response(view)


async def job_events(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    job_id = request.match_info["id"]
    if _visible_job(request, job_id) is None:
        return error(404, f"unknown job {job_id!r}")
    return json_response({"job_id": job_id, "events": encode_events(gw.jobs.events(job_id))})


async def job_decisions(request: web.Request) -> web.Response:
    """``mosaic explain``: the job's state and the newest decisions about it, with candidates."""
    gw = request.app[GATEWAY_KEY]
    job_id = request.match_info["id"]
    view = _visible_job(request, job_id)
    if view is None:
        return error(404, f"unknown job {job_id!r}")
    body = {"job": view, "decisions": gw.decisions.for_job(job_id)}
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


async def cancel_job(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    job_id = request.match_info["id"]
    view = _visible_job(request, job_id)
    if view is None:
        return error(404, f"unknown job {job_id!r}")
    if view.state in TERMINAL_STATES:
        return error(409, f"job {job_id!r} is already {view.state}")
    reason = request.query.get("reason") or "cancelled by user"
    try:
        await gw.cancel(job_id, reason)
    except Exception as exc:
        return _unavailable(gw, "cancel", job_id, exc)
    metrics.CANCELS.inc()
    return json_response({"job_id": job_id, "status": "cancelling"}, 202)


async def list_nodes(request: web.Request) -> web.Response:
    return json_response({"nodes": _nodes_for(request)})


def _nodes_for(request: web.Request) -> list[NodeView]:
    """Every node; a tenant sees on them only its own jobs' ids (the load stays visible)."""
    gw = request.app[GATEWAY_KEY]
    nodes = gw.nodes.views()
    who = caller(request)
    if who is None or who.admin:
        return nodes
    return [
        msgspec.structs.replace(v, jobs=tuple(j for j in v.jobs if _is_own(gw, j, who)))
        for v in nodes
    ]


def _is_own(gw: Gateway, job_id: str, who: Principal) -> bool:
    view = gw.jobs.get(job_id)
    return view is not None and who.sees(view.tenant)


async def healthz(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    if not gw.connected():
        return json_response({"status": "unavailable", "reason": "not connected to NATS"}, 503)
    # "now" is the Mosaic clock: a client turns "--deadline 2h" into an absolute time on it
    return json_response({"status": "ok", "now": gw.clock.now(), "clock_factor": gw.clock.factor})


async def metrics_text(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    for state in JOB_STATES:
        metrics.JOBS.labels(state).set(0)
    for state, n in gw.jobs.counts().items():
        metrics.JOBS.labels(state).set(n)
    metrics.NODES.set(len(gw.nodes.specs))
    return web.Response(
        body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


async def index(request: web.Request) -> web.Response:
    """With a token, the dashboard of what the caller may see; without one, only cluster-wide
    counts (a browser sends no bearer token, and nothing there names a job or a tenant)."""
    gw = request.app[GATEWAY_KEY]
    who = caller(request)
    if who is None:
        nodes = gw.nodes.views()
        busy = sum(v.gpus_allocated for v in nodes)
        total = sum(v.spec.gpu_count for v in nodes)
        page = public_page.render(busy, total, len(nodes), gw.jobs.counts())
    else:
        jobs = gw.jobs.list(tenant=who.tenant)
        counts = gw.jobs.counts() if who.admin else _counts(jobs)
        page = dashboard.render(_nodes_for(request), jobs, counts)
    return web.Response(text=page, content_type="text/html")


def _counts(jobs: list[JobView]) -> dict[str, int]:
    out: dict[str, int] = {}
    for j in jobs:
        out[j.state] = out.get(j.state, 0) + 1
    return out


def build_app(gw: Gateway, timeouts: HttpTimeouts | None = None) -> web.Application:
    """The app. Its ``GUARD_KEY`` watches for slow clients once ``serve`` calls ``watch``.
    Authentication comes before the Content-Type check and the body read: a stranger learns
    nothing and makes the gateway read nothing."""
    guard = ConnectionGuard(timeouts or HttpTimeouts(), error)
    auth = middleware(lambda request: request.app[GATEWAY_KEY].auth)
    middlewares = [guard.track, observe, json_errors, auth, require_json, guard.read_body]
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    app[GATEWAY_KEY] = gw
    app[GUARD_KEY] = guard
    app.on_cleanup.append(guard.close)
    app.router.add_get("/", index)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_text)
    app.router.add_post("/v1/jobs", submit)
    app.router.add_get("/v1/jobs", list_jobs)
    app.router.add_get("/v1/jobs/{id}", get_job)
    app.router.add_get("/v1/jobs/{id}/events", job_events)
    app.router.add_get("/v1/jobs/{id}/decisions", job_decisions)
    app.router.add_delete("/v1/jobs/{id}", cancel_job)
    app.router.add_get("/v1/nodes", list_nodes)
    tenants.add_routes(app)
    cordon_api.add_routes(app)
    profiles_api.add_routes(app)  # GET /v1/profiles (issue 15)
    services_api.add_routes(app)  # /v1/services (issue 16)
    return app
