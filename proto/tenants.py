"""Tenants of the HTTP API: the stored record (KV ``tenants``) and what the API shows of it.

Why only a hash of the token is stored: anyone who can read the bucket (an operator, a backup,
a service with KV read rights) must not be able to act as the tenant. The token itself is shown
once, in the answer to ``POST /v1/tenants``; the gateway compares the SHA-256 of what a caller
presents with ``token_sha256``. A random 32-byte token needs no salt or slow hash: there is no
dictionary to try against it.
"""

from __future__ import annotations

import re

import msgspec

# The same shape as ``JobSpec.tenant`` accepts (proto.validation), and a valid KV key.
TENANT_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class TenantRecord(msgspec.Struct, frozen=True, kw_only=True):
    """KV ``tenants``/<name>. ``may_run_commands``: its jobs may carry a ``command`` (a shell
    command the local-mode executor runs), which only an admin grants."""

    name: str
    token_sha256: str  # hex digest of the bearer token
    created_at: float  # Mosaic clock
    may_run_commands: bool = False


class TenantCreate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of ``POST /v1/tenants``."""

    name: str
    may_run_commands: bool = False


class TenantView(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant as ``GET /v1/tenants`` lists it: never the token or its hash."""

    name: str
    created_at: float
    may_run_commands: bool = False


class TenantCreated(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to ``POST /v1/tenants``: the only time the token is ever shown."""

    tenant: str
    token: str
    may_run_commands: bool = False


class TenantList(msgspec.Struct, frozen=True, kw_only=True):
    tenants: list[TenantView]
