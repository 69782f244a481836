"""One child process of the supervisor: started in its own session, signalled as a group, its
log tailed and its ``/healthz`` read. ``libs.client.supervisor`` runs a stack of them.

Why apart: what a single child is (how it starts, stops and says it is unwell) is the same for
every service and for the tests' ``kill``/``restart``; the stack only decides about many.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the folder holding proto/, libs/, services/


@dataclass
class Service:
    name: str
    args: list[str]
    env: dict[str, str]
    log_path: Path
    metrics_port: int | None = None
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0  # time.monotonic() of the last start

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        self.started_at = time.monotonic()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {self.name} {time.strftime('%H:%M:%S')} ---\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=ROOT,
                start_new_session=True,
            )

    def signal(self, sig: int) -> None:
        """Signal the child's whole process group (it may have children of its own)."""
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)

    def tail(self, lines: int = 8) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def health_problem(self, timeout_s: float = 1.0) -> str | None:
        """What ``/healthz`` on the metrics port says is wrong; None when healthy, when metrics
        are off, or when it does not answer yet (a starting child is not unhealthy)."""
        if not self.metrics_port:
            return None
        url = f"http://127.0.0.1:{self.metrics_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s):
                return None
        except urllib.error.HTTPError as exc:
            try:
                problems = json.loads(exc.read() or b"{}").get("problems") or {}
            except ValueError:
                problems = {}
            return "; ".join(f"{k}: {v}" for k, v in problems.items()) or f"HTTP {exc.code}"
        except TimeoutError:
            return "/healthz did not answer"
        except OSError:
            return None


def stop_services(services: list[Service], *, timeout_s: float) -> list[str]:
    for svc in services:
        svc.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    forced: list[str] = []
    for svc in services:
        if svc.process is None:
            continue
        try:
            svc.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            forced.append(svc.name)
            svc.signal(signal.SIGKILL)
            svc.process.wait(timeout=10)
    for svc in services:
        # a service may have started processes of its own (the executor's local mode): they
        # share its process group, which outlives the leader; take them down too
        if svc.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(svc.process.pid, signal.SIGKILL)
    return forced
