"""What ``mosaic up`` shows while it runs: a snapshot of the gateway's read model, rendered
either as a rich live view (a terminal) or as one summary line (logs, tests, pipes).

Pure rendering: a ``Snapshot`` in, text or rich renderables out; fetching lives in ``up``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from proto.decisions import Decision
from proto.views import JobView, NodeView

RUNNING_STATES = ("placed", "running")


@dataclass
class Snapshot:
    jobs: list[JobView]
    nodes: list[NodeView]
    elapsed_s: float = 0.0
    submitted_by_demo: int = 0
    refused_by_demo: int = 0
    decisions: list[Decision] = field(default_factory=list)
    problem: str = ""  # e.g. "gateway not reachable": shown, not fatal

    @property
    def counts(self) -> Counter[str]:
        return Counter(j.state for j in self.jobs)

    @property
    def running(self) -> int:
        c = self.counts
        return sum(c[s] for s in RUNNING_STATES)

    @property
    def gpus_total(self) -> int:
        return sum(n.spec.gpu_count for n in self.nodes)

    @property
    def gpus_busy(self) -> float:
        return sum(n.gpus_allocated for n in self.nodes)

    def mean_wait_s(self) -> float | None:
        """Mean Mosaic seconds from submission to start, over jobs that started."""
        waits = [
            j.start_time - j.submit_time
            for j in self.jobs
            if j.start_time is not None and j.submit_time is not None
        ]
        return sum(waits) / len(waits) if waits else None


def _fmt_wait(wait_s: float | None) -> str:
    return "-" if wait_s is None else f"{wait_s / 60:.1f}m"


def summary_line(s: Snapshot) -> str:
    """One line for ``--no-live`` and logs; stable keys so tests and scripts can parse it."""
    c = s.counts
    parts = [
        f"[{s.elapsed_s:5.0f}s]",
        f"jobs={len(s.jobs)}",
        f"pending={c['pending']}",
        f"running={s.running}",
        f"completed={c['completed']}",
        f"failed={c['failed']}",
        f"cancelled={c['cancelled']}",
        f"gpus_busy={s.gpus_busy:g}/{s.gpus_total}",
        f"mean_wait={_fmt_wait(s.mean_wait_s())}",
    ]
    if s.problem:
        parts.append(f"problem={s.problem!r}")
    return " ".join(parts)


def final_summary(s: Snapshot) -> str:
    c = s.counts
    lines = [
        "summary:",
        f"  jobs submitted  {s.submitted_by_demo if s.submitted_by_demo else len(s.jobs)}"
        + (f" (refused {s.refused_by_demo})" if s.refused_by_demo else ""),
        f"  completed       {c['completed']}",
        f"  failed          {c['failed']}",
        f"  cancelled       {c['cancelled']}",
        f"  still pending   {c['pending']}, running {s.running}",
        f"  mean wait       {_fmt_wait(s.mean_wait_s())} (Mosaic time)",
    ]
    return "\n".join(lines)


def gpu_bar(allocated: float, total: int) -> Text:
    """One cell per GPU: full, half (a fractional share) or free."""
    full = int(allocated)
    half = 1 if allocated - full >= 0.25 and full < total else 0
    free = max(0, total - full - half)
    text = Text()
    text.append("█" * full, style="green")
    text.append("▌" * half, style="yellow")
    text.append("·" * free, style="dim")
    return text


def nodes_table(nodes: list[NodeView]) -> Table:
    table = Table(title="nodes", expand=False, title_justify="left")
    for col in ("NODE", "MODEL", "GPUS", "USED", "JOBS", "TEMP", "POWER"):
        table.add_column(
            col, justify="right" if col in ("USED", "JOBS", "TEMP", "POWER") else "left"
        )
    for n in sorted(nodes, key=lambda v: v.spec.id):
        temp = power = "-"
        if n.telemetry and n.telemetry.gpus:
            temp = f"{max(g.temp_c for g in n.telemetry.gpus):.0f}°C"
            power = f"{sum(g.power_w for g in n.telemetry.gpus):.0f}W"
        table.add_row(
            n.spec.id
            + (" (cordoned)" if n.cordoned else "")
            + ("" if n.power.state == "awake" else f" ({n.power.state})"),
            n.spec.gpu_model,
            gpu_bar(n.gpus_allocated, n.spec.gpu_count),
            f"{n.gpus_allocated:g}/{n.spec.gpu_count}",
            str(len(n.jobs)),
            temp,
            power,
        )
    return table


def decisions_table(decisions: list[Decision]) -> Table:
    table = Table(title="last decisions", expand=False, title_justify="left")
    for col in ("JOB", "ACTION", "NODE", "REASON"):
        table.add_column(col)
    for d in decisions:
        table.add_row(d.job_id, d.action, d.node or "-", (d.reason or "")[:60])
    return table


def render(s: Snapshot, header: str) -> Group:
    c = s.counts
    status = Text.assemble(
        (f"{header}\n", "bold"),
        f"queue {c['pending']}   running {s.running}   ",
        (f"done {c['completed']}", "green"),
        "   ",
        (f"failed {c['failed']}", "red" if c["failed"] else ""),
        f"   cancelled {c['cancelled']}   GPUs busy {s.gpus_busy:g}/{s.gpus_total}",
        f"   mean wait {_fmt_wait(s.mean_wait_s())}   elapsed {s.elapsed_s:.0f}s",
    )
    if s.submitted_by_demo:
        status.append(f"   demo submitted {s.submitted_by_demo}")
    if s.problem:
        status.append(f"\n{s.problem}", style="red")
    parts: list[object] = [Panel(status), nodes_table(s.nodes)]
    if s.decisions:
        parts.append(decisions_table(s.decisions))
    parts.append(Text("Ctrl-C stops everything", style="dim"))
    return Group(*parts)  # type: ignore[arg-type]
