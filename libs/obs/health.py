"""A service's health: named checks that say what is wrong, served as ``/healthz``.

Why checks and not a flag: a process can look alive (its HTTP port answers, ``mosaic_service_up``
is 1) while the loop that does its work has died or wedged, or while its lease task is gone. Each
part that must keep running registers a check, a function returning ``None`` when healthy and a
one-line reason otherwise; ``/healthz`` answers 503 with the reasons when any check fails, so a
supervisor (``mosaic up``, compose, Kubernetes' liveness probe) restarts the service.

A check must be cheap and must not block: it reads state the part keeps (a task's ``done()``, a
heartbeat's age), it never does I/O.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

Check = Callable[[], "str | None"]


class Health:
    """The checks of one service process. ``problems()`` lists what is wrong now."""

    def __init__(self, service: str) -> None:
        self.service = service
        self._checks: dict[str, Check] = {}
        self._lock = threading.Lock()
        self.started_at = time.time()

    def register(self, name: str, check: Check) -> None:
        """Add (or replace) the check called ``name``."""
        with self._lock:
            self._checks[name] = check

    def unregister(self, name: str) -> None:
        with self._lock:
            self._checks.pop(name, None)

    def problems(self) -> dict[str, str]:
        """``{check name: reason}`` for each failing check; a check that raises is failing."""
        with self._lock:
            checks = list(self._checks.items())
        out: dict[str, str] = {}
        for name, check in checks:
            try:
                reason = check()
            except Exception as exc:
                reason = f"check raised {type(exc).__name__}: {exc}"
            if reason:
                out[name] = reason
        return out

    def healthy(self) -> bool:
        return not self.problems()

    def report(self) -> tuple[int, bytes]:
        """(HTTP status, JSON body) of ``/healthz``."""
        problems = self.problems()
        body = {
            "service": self.service,
            "status": "unhealthy" if problems else "ok",
            "problems": problems,
            "checks": sorted(self._checks),
        }
        return (503 if problems else 200), msgspec.json.encode(body)


class Heartbeat:
    """A loop's proof of life: ``beat()`` each turn; the check fails when the last beat is older
    than ``max_age_s`` (wedged) or when ``stopped`` is set while it should run (died)."""

    def __init__(self, name: str, max_age_s: float) -> None:
        self.name = name
        self.max_age_s = max_age_s
        self.last = time.monotonic()
        self.died: str | None = None

    def beat(self) -> None:
        self.last = time.monotonic()

    def dead(self, reason: str) -> None:
        self.died = reason

    def check(self) -> str | None:
        if self.died:
            return f"{self.name} died: {self.died}"
        age_s = time.monotonic() - self.last
        if age_s > self.max_age_s:
            return f"{self.name} wedged: no progress for {age_s:.0f} s"
        return None


class _Handler(BaseHTTPRequestHandler):
    health: Health | None = None

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            status, body, ctype = 200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST
        elif path == "/healthz" and self.health is not None:
            status, body = self.health.report()
            ctype = "application/json"
        else:
            status, body, ctype = 404, b"not found\n", "text/plain"
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # quiet: scraped every 15 s
        return


class ObsServer:
    """``/metrics`` and ``/healthz`` on one port, in a daemon thread."""

    def __init__(self, health: Health | None, port: int, host: str = "127.0.0.1") -> None:
        handler = type("ObsHandler", (_Handler,), {"health": health})
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.host = host
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="obs-http", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._server.shutdown()
            self._server.server_close()
