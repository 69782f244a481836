"""The read-only HTML dashboard at ``GET /``: nodes with GPUs busy/free, and the jobs.

Why server-rendered with a meta refresh: one static page with no JS framework is enough for a
glance at a demo cluster, works with ``curl``, and cannot drift from the API it renders (it
reads the same read model). Every value is escaped: job ids, tenants and reasons are user input.
"""

from __future__ import annotations

from html import escape

from proto.views import JobView, NodeView

MAX_JOBS_SHOWN = 200  # newest first; the API has them all

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin-bottom:1.5em}
th,td{border:1px solid #ccc;padding:2px 8px;text-align:left;font-size:13px}
th{background:#eee}.bar{font-family:monospace}.cordoned{color:#a00}
.pending{color:#a60}.running{color:#060}.failed{color:#a00}.completed{color:#555}
"""


def _gpu_bar(allocated: float, total: int) -> str:
    busy = min(total, round(allocated))
    return "#" * busy + "." * (total - busy)


def _cordon_note(v: NodeView) -> str:
    """What follows a cordoned node's id, with why; the reason is operator text, so escaped."""
    if not v.cordoned:
        return ""
    why = f": {escape(v.cordon_reason)}" if v.cordon_reason else ""
    return f' <span class="cordoned">(cordoned{why})</span>'


def _node_row(v: NodeView) -> str:
    s = v.spec
    temp = max((g.temp_c for g in v.telemetry.gpus), default=None) if v.telemetry else None
    util = (
        sum(g.util for g in v.telemetry.gpus) / len(v.telemetry.gpus)
        if v.telemetry and v.telemetry.gpus
        else None
    )
    cells = [
        escape(s.id) + _cordon_note(v),
        escape(s.gpu_model),
        escape(v.power.state),
        f'<span class="bar">{_gpu_bar(v.gpus_allocated, s.gpu_count)}</span>',
        f"{v.gpus_allocated:g}/{s.gpu_count}",
        f"{max(0.0, s.gpu_count - v.gpus_allocated):g}",
        f"{v.host_mem_allocated_gb:g}/{s.host_mem_gb:g}",
        "-" if util is None else f"{100 * util:.0f}%",
        "-" if temp is None else f"{temp:.0f}",
        escape(", ".join(v.jobs)),
    ]
    return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _job_row(j: JobView) -> str:
    cells = [
        escape(j.id),
        escape(j.tenant),
        f'<span class="{escape(j.state)}">{escape(j.state)}</span>',
        str(j.priority),
        f"{j.gpus:g}",
        escape(j.node or ""),
        escape(j.reason),
    ]
    return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def render(nodes: list[NodeView], jobs: list[JobView], counts: dict[str, int]) -> str:
    """The whole page. ``jobs`` oldest first, as the read model lists them."""
    busy = sum(v.gpus_allocated for v in nodes)
    total = sum(v.spec.gpu_count for v in nodes)
    summary = ", ".join(f"{k}: {n}" for k, n in sorted(counts.items())) or "no jobs"
    shown = list(reversed(jobs))[:MAX_JOBS_SHOWN]
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        "<meta http-equiv='refresh' content='2'><title>Mosaic</title>"
        f"<style>{_STYLE}</style></head><body>"
        f"<h1>Mosaic</h1><p>GPUs busy {busy:g} of {total}; jobs: {escape(summary)}</p>"
        "<h2>Nodes</h2><table><tr><th>node</th><th>model</th><th>power</th><th>GPUs</th><th>busy</th>"
        "<th>free</th><th>host GB</th><th>util</th><th>max °C</th><th>jobs</th></tr>"
        + "".join(_node_row(v) for v in nodes)
        + "</table>"
        + f"<h2>Jobs (newest {len(shown)} of {len(jobs)})</h2><table><tr><th>id</th>"
        "<th>tenant</th><th>state</th><th>prio</th><th>GPUs</th><th>node</th><th>reason</th></tr>"
        + "".join(_job_row(j) for j in shown)
        + "</table><p>API: <a href='/v1/jobs'>/v1/jobs</a> · <a href='/v1/nodes'>/v1/nodes</a>"
        " · <a href='/metrics'>/metrics</a></p></body></html>"
    )
