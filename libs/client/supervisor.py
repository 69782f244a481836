"""The process supervisor behind ``mosaic up`` and the end-to-end tests.

Why one supervisor for both: the demo and the tests must run the very same processes the same
way (a real nats-server, each service as its own ``python -m services.<name>`` child), so a test
that passes says something about what an operator runs. Every child gets its own session (and
process group): a Ctrl-C in the terminal reaches only ``mosaic up``, which then stops the
children in order and checks, by PID, that none is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from libs.bus.server import (
    NatsCluster,
    NatsServer,
    free_port,
    start_nats_cluster,
    start_nats_server,
)
from libs.client.api import ClientError, MosaicClient
from libs.client.credentials import Credentials, admin_url, service_credentials_env
from libs.clock import Clock
from proto.nodes import NodeSpec

# Start order: telemetry first (it puts the node specs into KV), the gateway last.
SERVICES: tuple[str, ...] = ("telemetry", "executor", "scorer", "placer", "gateway")
_ROOT = Path(__file__).resolve().parents[2]  # the folder holding proto/, libs/, services/


class StackError(RuntimeError):
    """The stack could not start or a service died. The message is one line naming the log to
    read; ``log_tail`` holds that log's last lines for whoever can show more than a line."""

    def __init__(self, message: str, log_tail: str = ""):
        super().__init__(message)
        self.log_tail = log_tail


@dataclass
class Service:
    name: str
    args: list[str]
    env: dict[str, str]
    log_path: Path
    metrics_port: int | None = None
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
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
                cwd=_ROOT,
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


@dataclass
class Stack:
    """NATS plus every service, as child processes. Use as a context manager or call ``stop()``."""

    nodes: list[NodeSpec]
    clock: Clock
    data_dir: Path
    nats: NatsServer | NatsCluster
    gateway_port: int
    services: dict[str, Service] = field(default_factory=dict)
    stopped: bool = False
    credentials: Credentials | None = None  # None: NATS without users (auth=False)

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    @property
    def nats_url(self) -> str:
        """The operator's address: with authentication on, the ``admin`` user is in it, so
        tests and the CLI on this machine connect as the operator. Never print it; the plain
        address is ``nats.url``."""
        return admin_url(self.nats.url, self.credentials)

    @property
    def logs_dir(self) -> Path:
        return self.data_dir / "logs"

    def client(self) -> MosaicClient:
        return MosaicClient(self.gateway_url)

    def metrics_urls(self) -> dict[str, str]:
        return {
            n: f"http://127.0.0.1:{s.metrics_port}/metrics"
            for n, s in self.services.items()
            if s.metrics_port
        }

    def alive(self) -> dict[str, bool]:
        return {n: s.alive() for n, s in self.services.items()} | {
            "nats": self.nats.process.poll() is None
        }

    def pids(self) -> dict[str, int]:
        """Every child PID ever started that may still exist (for leak checks)."""
        out = {n: s.pid for n, s in self.services.items() if s.pid}
        out["nats"] = self.nats.process.pid
        return out  # type: ignore[return-value]

    def dead(self) -> list[Service]:
        return [s for s in self.services.values() if not s.alive()]

    def kill(self, name: str) -> None:
        """SIGKILL one service (tests of crash recovery)."""
        svc = self._service(name)
        svc.signal(signal.SIGKILL)
        if svc.process:
            svc.process.wait(timeout=10)

    def restart(self, name: str) -> None:
        """Stop (if running) and start one service again with the same arguments."""
        svc = self._service(name)
        if svc.alive():
            _stop_services([svc], timeout_s=10)
        svc.restarts += 1
        svc.start()

    def wait_ready(
        self, timeout_s: float = 90.0, *, interrupted: Callable[[], bool] | None = None
    ) -> None:
        """Block until the gateway answers and lists every node; raise naming the log otherwise.

        ``interrupted`` is polled so that a Ctrl-C during a slow start is not ignored."""
        client = self.client()
        want = {n.id for n in self.nodes}
        deadline = time.monotonic() + timeout_s
        last = "gateway not answering yet"
        while time.monotonic() < deadline:
            if interrupted is not None and interrupted():
                raise StackError("interrupted while the stack was starting")
            self._check_alive()
            try:
                client.health()
                seen = {v.spec.id for v in client.nodes()}
                missing = want - seen
                if not missing:
                    return
                last = f"{len(missing)} of {len(want)} nodes not registered yet"
            except ClientError as exc:
                last = exc.one_line()
            time.sleep(0.3)
        raise StackError(
            f"stack not ready after {timeout_s:.0f} s ({last}); logs in {self.logs_dir}"
        )

    def _check_alive(self) -> None:
        for svc in self.services.values():
            if svc.process is not None and svc.process.poll() is not None:
                raise StackError(
                    f"service {svc.name} exited with code {svc.process.returncode}; "
                    f"see {svc.log_path}",
                    svc.tail(),
                )
        if self.nats.process.poll() is not None:
            raise StackError(f"nats-server exited; see {self.nats.store_dir}/nats-server.log")

    def stop(self, timeout_s: float = 10.0) -> list[str]:
        """SIGTERM every service, SIGKILL what is left after ``timeout_s``, then stop NATS.

        Returns the names of services that needed SIGKILL (empty on a clean stop)."""
        if self.stopped:
            return []
        # the gateway first (no new work), the node side last (it reports what was running)
        order = [self.services[n] for n in reversed(SERVICES) if n in self.services]
        forced = _stop_services(order, timeout_s=timeout_s)
        self.nats.stop()
        self.stopped = True
        return forced

    def write_state(self) -> Path:
        """``data_dir/stack.json``: how to reach this stack (for the CLI and for debugging)."""
        path = self.data_dir / "stack.json"
        state = {
            "gateway_url": self.gateway_url,
            "nats_url": self.nats.url,
            "credentials_dir": str(self.credentials.directory) if self.credentials else None,
            "clock_epoch": self.clock.epoch,
            "clock_factor": self.clock.factor,
            "pids": self.pids(),
            "logs": str(self.logs_dir),
            "metrics": self.metrics_urls(),
        }
        path.write_text(json.dumps(state, indent=2))
        return path

    def _service(self, name: str) -> Service:
        if name not in self.services:
            raise KeyError(f"no service {name!r}; have {', '.join(self.services)}")
        return self.services[name]

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stop_services(services: list[Service], *, timeout_s: float) -> list[str]:
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


def service_args(name: str, nodes: list[NodeSpec]) -> list[str]:
    """The command line of one service; the simulated nodes all live in one process each."""
    args = [sys.executable, "-m", f"services.{name}"]
    node_flags = [a for n in nodes for a in ("--node-spec", msgspec.json.encode(n).decode())]
    if name == "telemetry":
        args += ["--backend", "sim", *node_flags]
    elif name == "executor":
        args += ["--mode", "sim", *node_flags]
    return args


def start_stack(
    nodes: list[NodeSpec],
    *,
    clock_factor: float = 60.0,
    data_dir: Path,
    gateway_port: int | None = None,
    metrics: bool = False,
    extra_env: dict[str, str] | None = None,
    services: tuple[str, ...] = SERVICES,
    ready_timeout_s: float = 90.0,
    wait: bool = True,
    interrupted: Callable[[], bool] | None = None,
    auth: bool = True,
    tls: tuple[Path, Path, Path] | None = None,
    nats_cluster: int = 1,
) -> Stack:
    """Start nats-server and every service; return once the gateway lists every node.

    ``auth``: fresh credentials in ``data_dir/credentials`` (``libs.client.credentials``), a
    NATS user per service with only its subjects (``libs.bus.auth``); each service gets its
    file as ``MOSAIC_NATS_CREDS``. ``tls``: (cert, key, CA) for the server; clients then verify
    it against the CA. ``nats_cluster``: that many servers in one JetStream cluster, every
    stream and bucket with as many replicas (``MOSAIC_STREAM_REPLICAS``). On any failure
    everything already started is stopped before the error propagates."""
    if not nodes:
        raise StackError("the cluster has no nodes")
    data_dir = Path(data_dir)
    (data_dir / "logs").mkdir(parents=True, exist_ok=True)
    creds = None
    if auth:
        creds = Credentials.generate(data_dir / "credentials", nodes=[n.id for n in nodes])
        creds.tls_ca_file = str(Path(tls[2]).resolve()) if tls else None
    authorization = creds.server_authorization() if creds else None
    nats: NatsServer | NatsCluster
    if nats_cluster > 1:
        nats = start_nats_cluster(data_dir / "nats", n=nats_cluster, auth=authorization, tls=tls)
    else:
        nats = start_nats_server(data_dir / "nats", auth=authorization, tls=tls)
    if creds is not None:
        creds.write(nats.url)
    clock = Clock(epoch=time.time(), factor=clock_factor)
    stack = Stack(
        nodes=list(nodes),
        clock=clock,
        data_dir=data_dir,
        nats=nats,
        gateway_port=gateway_port or free_port(),
        credentials=creds,
    )
    base_env = dict(os.environ)
    for inherited in ("MOSAIC_METRICS_PORT", "MOSAIC_NATS_CREDS", "MOSAIC_ADMIN_TOKEN_FILE"):
        base_env.pop(inherited, None)
    base_env.update(clock.env())
    base_env.update(
        {
            "MOSAIC_NATS_URL": nats.url,
            "MOSAIC_STREAM_REPLICAS": str(max(1, nats_cluster)),
            "MOSAIC_LOG_FORMAT": "json",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(_ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
    )
    base_env.update(extra_env or {})
    try:
        for name in services:
            env = dict(base_env)
            port = free_port() if metrics else None
            env["MOSAIC_METRICS_PORT"] = str(port or 0)
            if name == "gateway":
                env["MOSAIC_HTTP_PORT"] = str(stack.gateway_port)
            env.update(service_credentials_env(name, creds))
            svc = Service(
                name=name,
                args=service_args(name, stack.nodes),
                env=env,
                log_path=data_dir / "logs" / f"{name}.log",
                metrics_port=port,
            )
            stack.services[name] = svc
            svc.start()
        stack.write_state()
        if wait:
            stack.wait_ready(ready_timeout_s, interrupted=interrupted)
    except BaseException:
        stack.stop(timeout_s=5)
        raise
    return stack
