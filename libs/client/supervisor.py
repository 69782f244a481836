"""The process supervisor behind ``mosaic up`` and the end-to-end tests.

Why one supervisor for both: the demo and the tests must run the very same processes the same
way (a real nats-server, each service as its own ``python -m services.<name>`` child), so a test
that passes says something about what an operator runs. Every child gets its own session (and
process group): a Ctrl-C in the terminal reaches only ``mosaic up``, which then stops the
children in order and checks, by PID, that none is left.

``Stack.supervise`` (called about once a second by ``mosaic up``) restarts a child that exited
or whose ``/healthz`` keeps failing, with the backoff and give-up rules of
``libs.client.restarts``; the tests' ``kill``/``restart`` act directly and are never undone by
it, since only ``mosaic up`` supervises.
"""

from __future__ import annotations

import json
import os
import signal
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
from libs.client.child import ROOT, Service, stop_services
from libs.client.credentials import (
    Credentials,
    admin_url,
    ensure_admin_token,
    service_credentials_env,
)
from libs.client.nats_members import member_pids, nats_log, restart_dead_members
from libs.client.restarts import GiveUp, Restarter
from libs.client.tokens import admin_token_file
from libs.clock import Clock
from proto.nodes import NodeSpec

# Start order: telemetry first (it puts the node specs into KV), the gateway last.
SERVICES: tuple[str, ...] = ("telemetry", "executor", "scorer", "placer", "gateway")
# the thermal guard (issue 14) just before the gateway (a line of its own: additions merge)
SERVICES = (*SERVICES[:-1], "thermal", SERVICES[-1])
# the defragmenter (issue 14), likewise before the gateway
SERVICES = (*SERVICES[:-1], "defrag", SERVICES[-1])
# the profiler (issue 15), likewise before the gateway
SERVICES = (*SERVICES[:-1], "profiler", SERVICES[-1])


class StackError(RuntimeError):
    """The stack could not start or a service died. The message is one line naming the log to
    read; ``log_tail`` holds that log's last lines for whoever can show more than a line."""

    def __init__(self, message: str, log_tail: str = ""):
        super().__init__(message)
        self.log_tail = log_tail


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
    restarter: Restarter = field(default_factory=Restarter)
    failure: str | None = None  # why supervise gave up (the stack is then to be stopped)
    nats_started_at: float = field(default_factory=time.monotonic)
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
        """A client with the stack's admin token (``data_dir/credentials/admin.token``, which the
        gateway was started with; made here if nobody has yet)."""
        return MosaicClient(self.gateway_url, token=ensure_admin_token(self.data_dir))

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
        if isinstance(self.nats, NatsCluster):
            out |= member_pids(self.nats)
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
            stop_services([svc], timeout_s=10)
        svc.restarts += 1
        svc.start()

    def supervise(self) -> list[str]:
        """One round: restart what died or stayed unhealthy once its backoff is due.

        Returns a line per restart (``restarted placer (exit code -9, restart 2)``). Raises
        ``StackError`` naming the log, and sets ``failure``, when a child needs more restarts
        than the policy allows. NATS is restarted too, on its port and store: every service
        reconnects by itself (nats-py retries forever once connected), so a crashed server costs
        an outage, not the stack. In a cluster, the dead member of it is restarted alone
        (``libs.client.nats_members``): the others keep serving."""
        now = time.monotonic()
        out: list[str] = []
        try:
            if isinstance(self.nats, NatsCluster):
                out += restart_dead_members(self.nats, self.restarter, now)
            elif self.nats.process.poll() is not None:
                self._schedule("nats", now, self.nats_started_at, self.nats.process.returncode)
                if self.restarter.due("nats", now):
                    reason = self.restarter.restarting("nats", now)
                    self.nats = start_nats_server(self.nats.store_dir, port=self.nats.port)
                    self.nats_started_at = time.monotonic()
                    out.append(f"restarted nats ({reason})")
            for svc in self.services.values():
                if svc.process is None:
                    continue
                if svc.alive():
                    problem = svc.health_problem()
                    if not self.restarter.unhealthy(svc.name, now=now, problem=problem):
                        continue
                    stop_services([svc], timeout_s=5)
                    self.restarter.exited(
                        svc.name,
                        now=now,
                        ran_s=now - svc.started_at,
                        reason=f"unhealthy: {problem}",
                    )
                else:
                    self._schedule(svc.name, now, svc.started_at, svc.process.returncode)
                if self.restarter.due(svc.name, now):
                    reason = self.restarter.restarting(svc.name, now)
                    svc.restarts += 1
                    svc.start()
                    out.append(f"restarted {svc.name} ({reason}, restart {svc.restarts})")
        except GiveUp as exc:
            name = exc.name
            log = (
                self.services[name].log_path if name in self.services else nats_log(self.nats, name)
            )
            tail = self.services[name].tail() if name in self.services else ""
            self.failure = f"{exc}; giving up; see {log}"
            raise StackError(self.failure, tail) from None
        if out:
            self.write_state()
        return out

    def _schedule(self, name: str, now: float, started_at: float, code: int | None) -> None:
        if not self.restarter.pending(name):
            self.restarter.exited(name, now=now, ran_s=now - started_at, reason=f"exit code {code}")

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
        rank = {n: i for i, n in enumerate(SERVICES)}
        order = sorted(
            self.services.values(), key=lambda s: -rank.get(module_of(s.name), len(rank))
        )
        forced = stop_services(order, timeout_s=timeout_s)
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
            "restarts": {n: s.restarts for n, s in self.services.items()},
            "logs": str(self.logs_dir),
            "admin_token_file": str(admin_token_file(self.data_dir).resolve()),
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


def module_of(name: str) -> str:
    """A service's module: ``placer@standby`` is a second placer replica (the lease decides
    which one is active), run as ``python -m services.placer``."""
    return name.split("@", 1)[0]


def service_args(name: str, nodes: list[NodeSpec], data_dir: Path | None = None) -> list[str]:
    """The command line of one service; the simulated nodes all live in one process each.

    The executor journals what it runs in ``data_dir/executor`` so that a restarted one (by
    this supervisor or by hand) re-adopts its jobs instead of losing them."""
    name = module_of(name)
    args = [sys.executable, "-m", f"services.{name}"]
    node_flags = [a for n in nodes for a in ("--node-spec", msgspec.json.encode(n).decode())]
    if name == "telemetry":
        args += ["--backend", "sim", *node_flags]
    elif name == "executor":
        args += ["--mode", "sim", *node_flags]
        if data_dir is not None:
            args += ["--state-dir", str(data_dir / "executor")]
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
    # the gateway's admin token (kept if a previous run made one): the CLI finds the same file
    admin_token = ensure_admin_token(data_dir)
    creds = None
    if auth:
        ids = [n.id for n in nodes]
        creds = Credentials.generate(data_dir / "credentials", nodes=ids, admin_token=admin_token)
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
                p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
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
                env["MOSAIC_ADMIN_TOKEN_FILE"] = str(admin_token_file(data_dir).resolve())
            env.update(service_credentials_env(module_of(name), creds))
            svc = Service(
                name=name,
                args=service_args(name, stack.nodes, data_dir),
                env=env,
                log_path=data_dir / "logs" / f"{name.replace('@', '-')}.log",
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
