"""The dashboard a caller without a token gets at ``GET /``: cluster-wide counts only.

Why a page at all without a token: a browser opening the gateway URL sends no bearer token, and
putting one in the URL would leave it in history, proxy logs and Referer headers. So the
anonymous page says how busy the cluster is - GPUs busy of total, node count, jobs per state -
and nothing that names a job, a tenant or a node; the full page (``dashboard.render``) needs a
token (``curl -H "Authorization: Bearer ..."``, or a proxy that adds it).
"""

from __future__ import annotations

from html import escape


def render(gpus_busy: float, gpus_total: int, nodes: int, counts: dict[str, int]) -> str:
    summary = ", ".join(f"{k}: {n}" for k, n in sorted(counts.items())) or "no jobs"
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        "<meta http-equiv='refresh' content='5'><title>Mosaic</title></head>"
        "<body style='font-family:system-ui,sans-serif;margin:1.5em'>"
        f"<h1>Mosaic</h1><p>GPUs busy {gpus_busy:g} of {gpus_total} on {nodes} nodes; "
        f"jobs: {escape(summary)}</p>"
        "<p>Jobs, nodes and tenants need a token: send <code>Authorization: Bearer &lt;token&gt;"
        "</code> (the admin token of <code>mosaic up</code> is in "
        "<code>DATA_DIR/credentials/admin.token</code>).</p></body></html>"
    )
