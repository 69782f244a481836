"""``mosaic explain JOB``: why a job is pending, or why it landed where it did.

A pending job's answer has numbers (like ``sprio`` and ``squeue --start``): its rank in the
queue, its priority score and terms, the node closest to holding it and what that node lacks,
and its reservation's expected start, asked of the active placer through the gateway. Every
job's answer lists the policy's decisions about it, the candidates weighed for a placement and
the nodes that could not take it.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from libs.client.api import DEFAULT_GATEWAY
from libs.client.cli_tenants import GatewayOpt, client_for

out = Console()


def explain(job_id: str, gateway: GatewayOpt = DEFAULT_GATEWAY) -> None:
    """Why a job is pending, or why it landed where it did: the policy's decisions about it."""
    body = client_for(gateway).get_json(f"/v1/jobs/{job_id}/decisions")
    job = body.get("job", {})
    out.print(
        f"[bold]{job_id}[/bold]  state {job.get('state', '?')}  node {job.get('node') or '-'}"
        + (f"  reason {job['reason']}" if job.get("reason") else "")
    )
    decisions = body.get("decisions", [])
    if not decisions:
        out.print("no decision recorded yet (the placer has not considered this job)")
        return
    for d in decisions:
        t = time.strftime("%H:%M:%S", time.localtime(d.get("time", 0)))
        where = f" on {d['node']}" if d.get("node") else ""
        out.print(
            f"{t}  {d.get('service', '?')}: {d.get('action', '?')}{where}"
            + (f"  ({d['reason']})" if d.get("reason") else ""),
            highlight=False,
        )
    last = decisions[-1]
    waits = [d["wait"] for d in decisions if d.get("action") == "wait" and d.get("wait")]
    if job.get("state") == "pending" and waits:
        _print_wait(waits[-1])
    candidates = last.get("candidates") or []
    if candidates:
        terms = sorted({k for c in candidates for k in (c.get("terms") or {})})
        table = Table(title="candidates weighed (best first)", box=None, header_style="bold")
        for col in ("NODE", "SCORE", *(t.upper() for t in terms)):
            table.add_column(col)
        for c in candidates:
            table.add_row(
                c.get("node", "?"),
                f"{c.get('total', 0):.3f}",
                *(f"{(c.get('terms') or {}).get(t, 0):.3f}" for t in terms),
            )
        out.print(table)
    filtered = last.get("filtered") or {}
    if filtered:
        table = Table(title="nodes that could not take it", box=None, header_style="bold")
        table.add_column("NODE")
        table.add_column("WHY")
        for node, why in sorted(filtered.items()):
            table.add_row(node, why)
        out.print(table)


def _print_wait(w: dict) -> None:
    """A pending job's numbers, as of its last wait decision (``proto.decisions.WaitNumbers``)."""
    out.print(
        f"rank {w.get('rank')} of {w.get('queued')} pending  score {w.get('score', 0):.3f}"
        f"  regime {w.get('regime') or '-'}",
        highlight=False,
    )
    terms = w.get("terms") or {}
    if terms:
        out.print("  " + "  ".join(f"{k} {v:.3f}" for k, v in terms.items()), highlight=False)
    policy = w.get("policy") or {}
    if policy:  # the policy in force then (libs.policy.daynight.in_force, as ``mosaic policy``)
        out.print(
            f"policy in force: period {w.get('period') or '(calendar off)'}  "
            + "  ".join(f"{k} {v:.3f}" for k, v in policy.items()),
            highlight=False,
        )
    if w.get("best_node"):
        out.print(f"closest node {w['best_node']}: lacks {w.get('lacks') or '-'}", highlight=False)
    if w.get("expected_start_s") is not None:
        start = time.strftime("%H:%M:%S", time.localtime(w["expected_start_s"]))
        out.print(f"reserved on {w.get('reservation_node')} from {start}", highlight=False)
