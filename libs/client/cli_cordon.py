"""``mosaic cordon NODE [--reason TEXT]`` and ``mosaic uncordon NODE`` (admin only).

Why through the HTTP API and not a KV write: the gateway owns the cordon fact (DESIGN rule 2)
and checks the caller's token; the CLI holds no NATS credentials. The token is found like every
other command's (``libs.client.tokens.find_token``: ``--token``, ``MOSAIC_TOKEN``,
``MOSAIC_TOKEN_FILE``, the local ``mosaic up``'s admin token for a loopback gateway).
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from libs.client.api import DEFAULT_GATEWAY
from libs.client.cli_tenants import GatewayOpt, client_for
from proto.cordons import CordonState

out = Console()


def _say(state: CordonState) -> None:
    """One line: the node's state now, with why."""
    if not state.cordoned:
        line = f"{state.node}: uncordoned"
    elif state.label and not state.by:
        line = f"{state.node}: still cordoned by a node label ({state.reason}); fix the label"
    else:
        why = f" ({state.reason})" if state.reason else ""
        line = f"{state.node}: cordoned{why}" + (" and by a node label" if state.label else "")
    out.print(line, highlight=False, markup=False)


def cordon(
    node: Annotated[str, typer.Argument(help="node id, as `mosaic nodes` lists it")],
    reason: Annotated[
        str, typer.Option("--reason", help="why, shown by `mosaic nodes` and the dashboard")
    ] = "",
    gateway: GatewayOpt = DEFAULT_GATEWAY,
) -> None:
    """Place nothing new on NODE (like scontrol ... State=DRAIN); its running jobs stay."""
    _say(client_for(gateway).cordon(node, reason))


def uncordon(
    node: Annotated[str, typer.Argument(help="node id")],
    gateway: GatewayOpt = DEFAULT_GATEWAY,
) -> None:
    """Let the placer use NODE again (a cordon label on the node itself stays)."""
    _say(client_for(gateway).uncordon(node))


def register(app: typer.Typer) -> None:
    app.command("cordon")(cordon)
    app.command("uncordon")(uncordon)
