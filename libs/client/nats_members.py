"""Bringing back the dead member of a NATS JetStream cluster (``Stack.supervise``).

Why a member and not the cluster: with R3 streams, losing one server of three loses nothing and
costs a leader election, but the cluster now runs without a spare; a second loss would stop
JetStream (no quorum). So the supervisor restarts just the dead server, as the same member: its
client and monitor ports (the services' URL lists them), its store (its replicas catch up from
the others instead of being copied whole) and its routes. The other two keep serving meanwhile;
restarting them too would turn a lost server into an outage.

Each member has its own backoff and give-up count (``libs.client.restarts``), keyed
``nats <server_name>``, so a member that keeps dying at start stops the stack naming its log.
"""

from __future__ import annotations

import time
from pathlib import Path

from libs.bus.server import NatsCluster, NatsServer
from libs.client.restarts import Restarter


def member_key(cluster: NatsCluster, index: int) -> str:
    """The restarter's name for one member: ``nats mosaic-1``."""
    return f"nats {cluster.name_of(index)}"


def nats_log(nats: NatsServer | NatsCluster, key: str) -> Path:
    """The log of the server ``key`` names (for a give-up message): a cluster member's own,
    else the single server's."""
    if isinstance(nats, NatsCluster):
        for i in range(len(nats.servers)):
            if member_key(nats, i) == key:
                return nats.log_path(i)
    return nats.store_dir / "nats-server.log"


def member_pids(cluster: NatsCluster) -> dict[str, int]:
    """Every member's current PID, by restarter name (leak checks after a stop)."""
    return {member_key(cluster, i): s.process.pid for i, s in enumerate(cluster.servers)}


def restart_dead_members(cluster: NatsCluster, restarter: Restarter, now: float) -> list[str]:
    """One round: schedule a restart of each member that exited, start those due.

    Returns ``restarted nats mosaic-1 (exit code -9, port 4711)`` per member started. A start
    that fails (a port still taken, a bad store) counts as another exit, so the backoff and the
    give-up rule apply to it as to a crash; ``GiveUp`` propagates to the caller."""
    out: list[str] = []
    for i, server in enumerate(cluster.servers):
        if server.process.poll() is None:
            continue
        key = member_key(cluster, i)
        if not restarter.pending(key):
            ran_s = now - server.started_at
            code = server.process.returncode
            restarter.exited(key, now=now, ran_s=ran_s, reason=f"exit code {code}")
        if not restarter.due(key, now):
            continue
        reason = restarter.restarting(key, now)
        try:
            cluster.restart(i)
        except (OSError, RuntimeError, TimeoutError) as exc:
            restarter.exited(key, now=time.monotonic(), ran_s=0.0, reason=f"start failed: {exc}")
            continue
        out.append(f"restarted {key} ({reason}, port {server.port})")
    return out
