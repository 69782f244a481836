"""The task's own Prometheus exporter: plain ``http.server``, text exposition format 0.0.4.

Why its own and not ``prometheus_client``: this package must run in a job's image with the
standard library only. Why per task: the node's exporters see GPUs, not steps; step time and
throughput are what tell a slow job from a stuck or starved one.

``GET /metrics`` answers ``render()``; every other path is a 404. It binds 127.0.0.1 unless
told otherwise (``MOSAIC_TASK_METRICS_HOST``): a scraper on another host is an explicit choice.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
POLL_S = 0.1  # how soon close() returns: it is on the checkpoint's path, inside the grace


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class Metric:
    """One metric family: a name, its HELP and TYPE, and its samples (``None``: none, the
    family's HELP then says why, as for CUDA time without CUDA)."""

    def __init__(self, name: str, kind: str, help_text: str, value: float | None) -> None:
        self.name, self.kind, self.help_text, self.value = name, kind, help_text, value

    def lines(self, labels: str) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help_text.replace(chr(10), ' ')}"
        yield f"# TYPE {self.name} {self.kind}"
        if self.value is not None:
            yield f"{self.name}{labels} {_number(self.value)}"


def exposition(metrics: Iterable[Metric], labels: dict[str, str]) -> str:
    """The text format: families one after the other, every sample with ``labels``."""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()) if v)
    rendered = f"{{{inner}}}" if inner else ""
    return "".join(f"{line}\n" for m in metrics for line in m.lines(rendered))


class Exporter:
    """Serves ``render()`` on ``host:port`` from a daemon thread; ``port`` 0 takes a free one
    (``self.port`` says which)."""

    def __init__(self, render: Callable[[], str], port: int, host: str = "127.0.0.1") -> None:
        self.render = render
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/metrics":
                    self._answer(404, b"not found: try /metrics\n", "text/plain")
                    return
                try:
                    body = exporter.render().encode("utf-8")
                except Exception as exc:  # a scrape must never take the job down
                    self._answer(500, f"render failed: {exc!r}\n".encode(), "text/plain")
                    return
                self._answer(200, body, CONTENT_TYPE)

            def _answer(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return  # the job's output is its own, not a scrape log

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": POLL_S},
            name="mosaic-task-exporter",
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
