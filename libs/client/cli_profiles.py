"""``mosaic profiles [--model M]``: the speed and power the scheduler uses per GPU model,
workload class and framework, and where each came from (measured, learnt, estimated from
specs, or still learning). Framework ``*`` is the row the scheduler decides with; the others
are what each framework's jobs alone have shown."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from libs.client.api import DEFAULT_GATEWAY
from libs.client.cli_tenants import GatewayOpt, client_for
from proto.gpus import canonical_model
from proto.profiles import ProfilesListing

out = Console()


def profiles_table(listing: ProfilesListing, model: str | None = None) -> Table:
    t = Table(title=f"profiles (version {listing.version})", title_justify="left")
    for col in ("MODEL", "CLASS", "FRAMEWORK", "SPEED", "POWER W", "SAMPLES", "SOURCE"):
        t.add_column(col, justify="right" if col in ("SPEED", "POWER W", "SAMPLES") else "left")
    want = canonical_model(model) if model else None
    for r in listing.rows:
        if want is not None and r.model != want:
            continue
        t.add_row(
            r.model,
            r.workload_class,
            r.framework,
            f"{r.speed:.3f}",
            f"{r.power_w:.0f}",
            str(r.samples),
            r.source,
        )
    return t


def profiles(
    model: Annotated[str | None, typer.Option("--model", help="only this GPU model")] = None,
    gateway: GatewayOpt = DEFAULT_GATEWAY,
) -> None:
    """Speed (x the reference V100) and busy power per GPU, with each entry's source."""
    out.print(profiles_table(client_for(gateway).profiles(), model))


def register(app: typer.Typer) -> None:
    app.command("profiles")(profiles)
