"""The CLI's credentials: the global ``--token`` option, and ``mosaic tenant add|list|delete``.

Why a module of its own: ``cli.py`` holds the job commands; who the caller is and the admin's
tenant commands are one concern, registered on the same typer app by ``register``. The token a
command sends comes from ``libs.client.tokens.find_token`` (``--token``, ``MOSAIC_TOKEN``,
``MOSAIC_TOKEN_FILE``, the local ``mosaic up``'s admin token).
"""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from libs.client.api import DEFAULT_GATEWAY, MosaicClient
from libs.client.tokens import find_token

tenant_app = typer.Typer(help="Tenants and their API tokens (admin only).", no_args_is_help=True)
out = Console()
_given: dict[str, str | None] = {"token": None}

GatewayOpt = Annotated[str, typer.Option("--gateway", envvar="MOSAIC_GATEWAY", help="gateway URL")]


def global_options(
    token: Annotated[
        str | None,
        typer.Option(
            "--token", envvar="MOSAIC_TOKEN", help="API bearer token (else MOSAIC_TOKEN_FILE)"
        ),
    ] = None,
) -> None:
    """Mosaic: a scheduler for heterogeneous GPU clusters."""
    _given["token"] = token  # set on every invocation, so one run never inherits another's


def client_for(gateway: str) -> MosaicClient:
    """A client of ``gateway`` that sends the token this invocation should use."""
    return MosaicClient(gateway, token=find_token(gateway, _given["token"]))


@tenant_app.command("add")
def add(
    name: str,
    may_run_commands: Annotated[
        bool, typer.Option("--may-run-commands", help="its jobs may carry a shell command")
    ] = False,
    gateway: GatewayOpt = DEFAULT_GATEWAY,
) -> None:
    """Create a tenant; prints its name and token (shown only this once)."""
    made = client_for(gateway).create_tenant(name, may_run_commands=may_run_commands)
    out.print(f"tenant {made.tenant}", highlight=False)
    out.print(f"token  {made.token}", highlight=False, soft_wrap=True)
    if made.may_run_commands:
        out.print("may run commands", highlight=False)


@tenant_app.command("list")
def list_(gateway: GatewayOpt = DEFAULT_GATEWAY) -> None:
    """Tenants: NAME, CREATED, COMMANDS (never their tokens)."""
    table = Table(box=None, header_style="bold")
    for col in ("NAME", "CREATED", "COMMANDS"):
        table.add_column(col)
    for t in client_for(gateway).tenants():
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t.created_at))
        table.add_row(t.name, created, "yes" if t.may_run_commands else "no")
    out.print(table)


@tenant_app.command("delete")
def delete(name: str, gateway: GatewayOpt = DEFAULT_GATEWAY) -> None:
    """Revoke a tenant's token (its jobs stay)."""
    client_for(gateway).delete_tenant(name)
    out.print(f"{name}: deleted", highlight=False)


def register(app: typer.Typer) -> None:
    app.callback()(global_options)
    app.add_typer(tenant_app, name="tenant")
