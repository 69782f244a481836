"""Who is calling the HTTP API: bearer tokens, the admin and the tenants, and the route roles.

Why bearer tokens and not sessions or mTLS: every client of the API is a program (the CLI, a job
producer, a script with curl) that can send one header; a token per tenant is what an operator
hands out and revokes. Two roles (DESIGN rule 6):

- the **admin** (the operator): one token read from a file at start (``mosaic up`` writes
  ``DATA_DIR/credentials/admin.token``); sees and cancels every job, manages tenants;
- a **tenant**: a token made by ``POST /v1/tenants``; only a hash of it is stored (KV
  ``tenants``, ``proto.tenants``), so it survives a gateway restart and a reader of the bucket
  learns nothing usable. A tenant sees only its own jobs.

Comparisons never leak through timing: the admin token is compared with
``hmac.compare_digest``; a tenant token is looked up by its SHA-256 (an attacker who could time
the lookup would learn bits of a hash, not of a token) and the hit is confirmed with
``compare_digest`` as well.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import Counter

from proto.tenants import TenantRecord

ADMIN = "admin"
MIN_TOKEN_CHARS = 16  # an admin token file shorter than this is a mistake, not a secret
REALM = 'Bearer realm="mosaic"'

# Route roles, by route pattern (``request.match_info.route.resource.canonical``).
PUBLIC_ROUTES = frozenset({"/healthz"})  # probes: nobody has a token there
ANONYMOUS_OK = frozenset({"/"})  # the dashboard: aggregate counts without a token
LOOPBACK_OR_ADMIN = frozenset({"/metrics"})
ADMIN_ROUTES = frozenset({"/v1/tenants", "/v1/tenants/{name}"})
ADMIN_ROUTES |= {"/v1/nodes/{id}/cordon", "/v1/nodes/{id}/uncordon"}  # cordon_api (issue 13)

REFUSED = Counter(
    "mosaic_gateway_auth_refused_total",
    "Requests refused by authentication: missing (401), invalid token (401), forbidden (403).",
    ["reason"],
)


class AuthConfigError(RuntimeError):
    """The gateway cannot start: no usable admin token and no explicit ``--insecure-no-auth``."""


@dataclass(frozen=True)
class Principal:
    """The authenticated caller. ``tenant`` None = the admin (every tenant)."""

    tenant: str | None
    may_run_commands: bool = False

    @property
    def admin(self) -> bool:
        return self.tenant is None

    @property
    def name(self) -> str:
        return ADMIN if self.tenant is None else self.tenant

    def sees(self, tenant: str) -> bool:
        """May this caller see (read, explain, cancel) a job of ``tenant``?"""
        return self.tenant is None or self.tenant == tenant


ADMIN_PRINCIPAL = Principal(tenant=None, may_run_commands=True)
PRINCIPAL_KEY: web.RequestKey[Principal | None] = web.RequestKey("principal")


def new_token() -> str:
    """32 random bytes, URL-safe base64 (43 characters): fits a header, a file, a shell."""
    return secrets.token_urlsafe(32)


def token_sha256(token: str) -> str:
    # surrogateescape: aiohttp decodes a header's non-UTF-8 bytes to surrogates, which a plain
    # encode() refuses (a 500 the HTTP fuzz found); such a token is simply unknown
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def load_admin_token(path: str | Path) -> str:
    """The admin token from ``path`` (surrounding whitespace ignored); refuses an unreadable,
    empty or too short file with a message naming it, so a broken deploy fails at start."""
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise AuthConfigError(f"admin token file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise AuthConfigError(f"admin token file {path}: not text") from None
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise AuthConfigError(
            f"admin token file {path}: need one token of at least {MIN_TOKEN_CHARS} characters"
            " without spaces"
        )
    return token


class Authenticator:
    """Token -> ``Principal``. Tenants arrive from the KV watch (``put``); ``admin_token`` None
    is the explicit insecure mode, where a caller without a token acts as the admin."""

    def __init__(self, admin_token: str | None) -> None:
        self._admin_sha = token_sha256(admin_token) if admin_token is not None else None
        self.tenants: dict[str, TenantRecord] = {}
        self._by_sha: dict[str, str] = {}

    @property
    def insecure(self) -> bool:
        return self._admin_sha is None

    def put(self, name: str, record: TenantRecord | None) -> None:
        """Add, replace or (``record`` None) revoke a tenant."""
        old = self.tenants.pop(name, None)
        if old is not None:
            self._by_sha.pop(old.token_sha256, None)
        if record is not None:
            self.tenants[name] = record
            self._by_sha[record.token_sha256] = name

    def authenticate(self, token: str | None) -> Principal | None:
        """The caller for ``token``; None when the token is unknown (or absent, unless insecure)."""
        if token is None:
            return ADMIN_PRINCIPAL if self.insecure else None
        sha = token_sha256(token)
        if self._admin_sha is not None and hmac.compare_digest(sha, self._admin_sha):
            return ADMIN_PRINCIPAL
        record = self.tenants.get(self._by_sha.get(sha, ""))
        if record is None or not hmac.compare_digest(sha, record.token_sha256):
            return None
        return Principal(tenant=record.name, may_run_commands=record.may_run_commands)


def bearer(request: web.Request) -> str | None:
    """The token of ``Authorization: Bearer <token>``; None without one. A malformed header
    (another scheme, no token) counts as a wrong token: ``""``."""
    header = request.headers.get("Authorization")
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return ""
    return token


def is_loopback(request: web.Request) -> bool:
    """Did the request come from this machine? (Behind a reverse proxy on the same host every
    request does: such a deploy must not expose ``/metrics`` through the proxy.)"""
    try:
        return ipaddress.ip_address(request.remote or "").is_loopback
    except ValueError:
        return False


def unauthorized(message: str, invalid: bool) -> web.Response:
    """401 with the RFC 6750 challenge (``error="invalid_token"`` when one was presented)."""
    challenge = REALM + (', error="invalid_token"' if invalid else "")
    return web.json_response(
        {"error": message, "errors": []}, status=401, headers={"WWW-Authenticate": challenge}
    )


def forbidden(message: str) -> web.Response:
    return web.json_response({"error": message, "errors": []}, status=403)


def middleware(
    get_auth: Callable[[web.Request], Authenticator],
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """An aiohttp middleware enforcing the route roles above; it leaves the caller (or None for
    an anonymous one on an anonymous-ok route) in ``request[PRINCIPAL_KEY]`` for the handlers."""

    @web.middleware
    async def authenticate(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else ""
        if route in PUBLIC_ROUTES or (route in LOOPBACK_OR_ADMIN and is_loopback(request)):
            request[PRINCIPAL_KEY] = None
            return await handler(request)
        token = bearer(request)
        principal = get_auth(request).authenticate(token)
        if token is not None and principal is None:
            REFUSED.labels("invalid").inc()
            return unauthorized("invalid or revoked token", True)
        if principal is None:
            if route in ANONYMOUS_OK:
                request[PRINCIPAL_KEY] = None
                return await handler(request)
            REFUSED.labels("missing").inc()
            return unauthorized("authentication required: Authorization: Bearer <token>", False)
        if (route in ADMIN_ROUTES or route in LOOPBACK_OR_ADMIN) and not principal.admin:
            REFUSED.labels("forbidden").inc()
            return forbidden(f"{route} is for the admin; tenant {principal.name!r} may not use it")
        request[PRINCIPAL_KEY] = principal
        return await handler(request)

    return authenticate


def caller(request: web.Request) -> Principal | None:
    """The authenticated caller of this request (None: anonymous on an anonymous-ok route)."""
    return request.get(PRINCIPAL_KEY)


def authenticator(args: Any, log: Any) -> Authenticator:
    """The admin token from ``--admin-token-file``; without one the gateway refuses to start
    unless ``--insecure-no-auth`` says so explicitly (fail closed: a forgotten flag must not
    open the API to anyone who can reach it)."""
    path = getattr(args, "admin_token_file", None) or os.environ.get("MOSAIC_ADMIN_TOKEN_FILE")
    if path:
        return Authenticator(load_admin_token(path))
    if getattr(args, "insecure_no_auth", False):
        log.warning("http_auth_disabled", note="--insecure-no-auth: every caller is the admin")
        return Authenticator(admin_token=None)
    raise AuthConfigError(
        "no admin token: pass --admin-token-file (env MOSAIC_ADMIN_TOKEN_FILE), which `mosaic up`"
        " writes to DATA_DIR/credentials/admin.token, or --insecure-no-auth"
    )
