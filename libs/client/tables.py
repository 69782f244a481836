"""The tables of ``mosaic queue`` (like squeue) and ``mosaic nodes`` (like sinfo)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from proto.views import JobView, NodeView


def jobs_table(jobs: list[JobView]) -> Table:
    table = Table(box=None, header_style="bold")
    for col in ("ID", "TENANT", "STATE", "PRIO", "GPUS", "NODE", "REASON"):
        table.add_column(col, justify="right" if col in ("PRIO", "GPUS") else "left")
    for j in sorted(jobs, key=lambda j: (j.submit_time or 0, j.id)):
        table.add_row(
            j.id, j.tenant, j.state, str(j.priority), f"{j.gpus:g}", j.node or "-", j.reason
        )
    return table


def _power_state(n: NodeView) -> str:
    p = n.power
    if p.state == "waking" and p.ready_at is not None:
        return f"waking (up at {p.ready_at:.0f})"
    return p.state


def nodes_table(nodes: list[NodeView]) -> Table:
    """NODE, MODEL, GPUS (used/total), GPU MEM, HOST MEM, TEMP, WATTS (drawn now), STATE
    (idle/mix/alloc, or drain when cordoned), POWER (awake/suspending/asleep/waking; a waking
    node shows when it expects to be up, on the Mosaic clock), REASON (why it is cordoned, like
    ``sinfo -R``)."""
    table = Table(box=None, header_style="bold")
    cols = ("NODE", "MODEL", "GPUS", "GPU MEM", "HOST MEM", "TEMP", "WATTS", "STATE", "POWER")
    for col in (*cols, "REASON"):
        table.add_column(col)
    for n in sorted(nodes, key=lambda v: v.spec.id):
        s = n.spec
        temp = power = "-"
        if n.telemetry and n.telemetry.gpus:
            temp = f"{max(g.temp_c for g in n.telemetry.gpus):.0f}C"
            power = f"{sum(g.power_w for g in n.telemetry.gpus):.0f}W"
        if n.cordoned:
            st = "drain"
        elif n.gpus_allocated >= s.gpu_count:
            st = "alloc"
        elif n.gpus_allocated > 0:
            st = "mix"
        else:
            st = "idle"
        table.add_row(
            s.id,
            s.gpu_model,
            f"{n.gpus_allocated:g}/{s.gpu_count}",
            f"{s.gpu_mem_gb:g}G",
            f"{n.host_mem_allocated_gb:g}/{s.host_mem_gb:g}G",
            temp,
            power,
            st,
            _power_state(n),
            Text(n.cordon_reason if n.cordoned else ""),  # operator text: never rich markup
        )
    return table
