"""``mosaic services``, ``mosaic service apply FILE.json`` and ``mosaic service rm ID``.

Why through the HTTP API and not a KV write: the gateway owns the service definitions (KV
``services``, DESIGN rule 2), checks the caller's token and refuses a bad definition naming
each field; the CLI holds no NATS credentials. The token is found like every other command's
(``libs.client.tokens.find_token``). Replicas are the scaler's: there is no command to add or
stop one by hand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from libs.client.api import DEFAULT_GATEWAY
from libs.client.cli_tenants import GatewayOpt, client_for
from proto.service_views import ServiceView

service_app = typer.Typer(help="Inference services Mosaic scales.", no_args_is_help=True)
out = Console()


def _load(view: ServiceView) -> str:
    r = view.load
    if r is None:
        return "-"
    p99 = f", p99 {r.p99_ms:g} ms" if r.p99_ms is not None else ""
    return f"{r.rps:g} req/s{p99}"


def services_table(views: list[ServiceView]) -> Table:
    """SERVICE, TENANT, REPLICAS (running/asked, range), LOAD, LAST REASON."""
    t = Table(box=None, header_style="bold")
    for col in ("SERVICE", "TENANT", "REPLICAS", "RANGE", "LOAD", "LAST REASON"):
        t.add_column(col)
    for v in views:
        svc = v.service
        running = sum(1 for r in v.replicas if r.state == "running")
        t.add_row(
            svc.id,
            svc.replica.tenant,
            f"{running}/{len(v.replicas)}",
            f"{svc.min_replicas}-{svc.max_replicas}",
            _load(v),
            v.last_reason or "-",
        )
    return t


def services(gateway: GatewayOpt = DEFAULT_GATEWAY) -> None:
    """Services: replicas running/asked, their range, the newest load, why they last moved."""
    out.print(services_table(client_for(gateway).services()))


@service_app.command("apply")
def apply(
    path: Annotated[Path, typer.Argument(help="an InferenceService as JSON", exists=True)],
    gateway: GatewayOpt = DEFAULT_GATEWAY,
) -> None:
    """Define or redefine a service from FILE.json (refused naming each bad field)."""
    view = client_for(gateway).apply_service(path.read_bytes())
    svc = view.service
    out.print(
        f"{svc.id}: {svc.min_replicas}-{svc.max_replicas} replicas, "
        f"{svc.rps_per_replica:g} req/s each",
        highlight=False,
        markup=False,
    )


@service_app.command("rm")
def rm(
    service_id: Annotated[str, typer.Argument(help="service id, as `mosaic services` lists it")],
    gateway: GatewayOpt = DEFAULT_GATEWAY,
) -> None:
    """Remove a service; its replicas are stopped ("scaled down: service removed")."""
    client_for(gateway).remove_service(service_id)
    out.print(f"{service_id}: removed", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.command("services")(services)
    app.add_typer(service_app, name="service")
