"""Who may publish and subscribe to what on NATS: the permission table, as data.

Why a table and not a server config written by hand: the subjects are constants in
``proto.subjects``, and the permissions must follow them when they change. Everything here is
built from those constants, so ``mosaic up``, compose and Kubernetes all get the same rules
(``python -m libs.client.credentials conf`` prints the deployments' server config).

The principles (DESIGN.md rule 6, issue 12):

* only the placer publishes node commands (``node.>``) and writes the ledger and the lease;
* only the gateway writes cordons (``cordons``, the operator's through the API); the placer reads;
* likewise service definitions (``services``, issue 16); a job producer (a service or its
  sidecar) may publish load reports (``load.<service>``), which the placer and gateway read;
* an executor consumes only the command subjects of the nodes it hosts, by name;
* a job producer only publishes ``jobs.submit`` / ``jobs.cancel``;
* only the admin (a test's controller) publishes ``clock.step``; each service acks steps on
  ``clock.ack.<its user>`` only (the stepped clock, ``libs.bus.steps``);
* every user has a private reply inbox (``_INBOX.<user>.>``) so no one reads another's replies
  or JetStream deliveries (a pull consumer delivers into the fetching client's inbox);
* JetStream API access is per stream and per verb; no service may delete or purge a stream, a
  consumer of another stream, or a message. Only ``admin`` (operators and tests) may.

What subject permissions cannot express: the lifecycle subject is ``lifecycle.<job>``, so a
service allowed to publish lifecycle events may publish any job's (the gateway ``Submitted``,
the scorer ``Queued``, the placer ``Placed``/``Cancelled``, the executor ``Started`` to
``Completed``).
Validating that an event fits the ledger is the consumers' job (docs/operations.md).
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proto import subjects

JS = "$JS.API"
ADMIN = "admin"
PRODUCER = "producer"
# every user that runs as a Mosaic service; profiler/defrag/thermal are granted ahead of time
SERVICE_USERS: tuple[str, ...] = (
    "gateway",
    "scorer",
    "placer",
    "executor",
    "telemetry",
    "profiler",
    "defrag",
    "thermal",
)
USERS: tuple[str, ...] = (*SERVICE_USERS, PRODUCER, ADMIN)
# a tenants bucket for the HTTP tokens, if the gateway keeps one (owner: gateway)
KV_TENANTS = getattr(subjects, "KV_TENANTS", "tenants")
# read-model snapshots (libs.bus.snapshot; owner: each service for its own models)
OBJ_SNAPSHOTS = getattr(subjects, "OBJ_SNAPSHOTS", "snapshots")


@dataclass(frozen=True)
class Permissions:
    """Allow lists; anything not listed is denied (NATS default-deny once a list exists)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


def inbox_prefix(user: str) -> str:
    """The reply-inbox prefix a user connects with (``nats.connect(inbox_prefix=...)``)."""
    return f"_INBOX.{user}"


def _kv_stream(bucket: str) -> str:
    return f"KV_{bucket}"


def _topology() -> list[str]:
    """``Bus.ensure_topology``: every service creates what is missing and reads stream info.
    An identical create is a no-op; a create with another config is refused by the server, and
    updating a config (``STREAM.UPDATE``) is left to the placer and the admin."""
    names = [*subjects.STREAMS, *(_kv_stream(b) for b in subjects.KV_BUCKETS)]
    out = [f"{JS}.INFO"]
    for n in names:
        out += [f"{JS}.STREAM.CREATE.{n}", f"{JS}.STREAM.INFO.{n}"]
    return out


def _stream_update() -> list[str]:
    names = [*subjects.STREAMS, *(_kv_stream(b) for b in subjects.KV_BUCKETS)]
    return [f"{JS}.STREAM.UPDATE.{n}" for n in names]


def _consume(stream: str, consumer: str = "*", filter_: str = ">") -> list[str]:
    """Create, read, fetch from and ack a consumer on ``stream``.

    ``consumer="*"``: any name (ephemeral consumers and KV watches get server- or client-chosen
    names), any filter. A named consumer may only be created with the subject filter
    ``filter_`` in its create subject (nats-py puts it there since server 2.9), so an executor
    cannot open a consumer on another node's commands under its own name.
    """
    if consumer == "*":
        create = [
            f"{JS}.CONSUMER.CREATE.{stream}",
            f"{JS}.CONSUMER.CREATE.{stream}.*",
            f"{JS}.CONSUMER.CREATE.{stream}.*.>",
        ]
    else:
        create = [f"{JS}.CONSUMER.CREATE.{stream}.{consumer}.{filter_}"]
    return [
        *create,
        f"{JS}.CONSUMER.INFO.{stream}.{consumer}",
        f"{JS}.CONSUMER.MSG.NEXT.{stream}.{consumer}",
        f"{JS}.CONSUMER.DELETE.{stream}.{consumer}",
        f"{JS}.STREAM.INFO.{stream}",
        f"$JS.ACK.{stream}.{consumer}.>",
    ]


def _read_stream(stream: str) -> list[str]:
    """Direct reads of single messages (last message of a subject, by sequence)."""
    return [
        f"{JS}.DIRECT.GET.{stream}",
        f"{JS}.DIRECT.GET.{stream}.>",
        f"{JS}.STREAM.MSG.GET.{stream}",
    ]


def _kv_read(bucket: str) -> list[str]:
    """Get, list and watch a bucket (a watch is an ordered push consumer with flow control)."""
    s = _kv_stream(bucket)
    return [*_read_stream(s), *_consume(s), f"$JS.FC.{s}.>"]


def _kv_write(bucket: str, keys: str = ">") -> list[str]:
    """Put, create, CAS-update and delete keys (all are publishes to ``$KV.<bucket>.<key>``)."""
    return [*_kv_read(bucket), f"$KV.{bucket}.{keys}"]


def _obj_store(bucket: str) -> list[str]:
    """Create, read and replace objects of an Object Store bucket (stream ``OBJ_<bucket>``):
    chunks and metadata are publishes to ``$O.<bucket>.>``, reading a chunked object is an
    ordered consumer, and replacing one purges the old chunks (a purge of that bucket only).
    nats-py's ``get`` subscribes to the chunks without naming the stream, so it looks the stream
    up by subject (``STREAM.NAMES``, which lists names only): without it no snapshot loads."""
    s = f"OBJ_{bucket}"
    return [
        f"{JS}.STREAM.NAMES",
        f"{JS}.STREAM.CREATE.{s}",
        f"{JS}.STREAM.INFO.{s}",
        f"{JS}.STREAM.PURGE.{s}",
        *_read_stream(s),
        *_consume(s),
        f"$JS.FC.{s}.>",
        f"$O.{bucket}.>",
    ]


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def permissions(user: str, *, nodes: Sequence[str] = ()) -> Permissions:
    """The allow lists of ``user``. ``nodes``: the node ids an executor or telemetry user hosts
    (one process may host several simulated nodes); empty means none, ``"*"`` any node."""
    if user == ADMIN:
        return Permissions(publish=(">",), subscribe=(">",))
    lifecycle = f"{subjects.LIFECYCLE_PREFIX}.>"
    inbox = f"{inbox_prefix(user)}.>"
    sub: list[str] = [inbox]
    pub: list[str]
    if user == PRODUCER:
        # a JetStream publish is a request: the stream's ack comes back to the producer's inbox
        return Permissions(
            publish=(subjects.SUBJECT_SUBMIT, subjects.SUBJECT_CANCEL, subjects.LOAD_ALL),
            subscribe=(inbox,),
        )
    if user not in SERVICE_USERS:
        raise KeyError(f"no NATS user {user!r}; known: {', '.join(USERS)}")
    pub = [*_topology(), subjects.dlq(user)]
    # the stepped clock (tests; libs.bus.steps): follow clock.step, ack as this user only
    pub += [subjects.clock_ack(user), f"{subjects.clock_ack(user)}.>"]
    sub += [subjects.CLOCK_STEP]
    if user == "gateway":
        pub += [subjects.SUBJECT_SUBMIT, subjects.SUBJECT_CANCEL, lifecycle]  # Submitted
        pub += _consume(subjects.STREAM_LIFECYCLE) + _consume(subjects.STREAM_DECISIONS)
        pub += _read_stream(subjects.STREAM_JOBS)  # a duplicate submission's original
        # bus producers' submissions: its one durable consumer, filtered to jobs.submit
        pub += _consume(subjects.STREAM_JOBS, subjects.CONSUMER_SUBMIT, subjects.SUBJECT_SUBMIT)
        pub += _kv_read(subjects.KV_NODES) + _kv_read(subjects.KV_LEDGER)
        pub += _kv_write(KV_TENANTS)
        pub += _kv_write(subjects.KV_CORDONS)  # operators cordon through the API (issue 13)
        pub += _kv_read(subjects.KV_PROFILES)  # GET /v1/profiles (issue 15)
        pub += _kv_write(subjects.KV_SERVICES)  # POST /v1/services (issue 16)
        pub += _obj_store(OBJ_SNAPSHOTS)  # its read models' snapshots
        sub += [subjects.TELEMETRY_ALL, subjects.EXECUTOR_REPORTS_ALL]  # power states
        sub += [subjects.LOAD_ALL]  # GET /v1/services: each service's newest load report
    elif user == "scorer":
        pub += [lifecycle]  # Queued: the admission score (no queue of its own any more)
        pub += _consume(subjects.STREAM_LIFECYCLE)
        pub += _kv_read(subjects.KV_NODES) + _kv_read(subjects.KV_LEDGER)
        pub += _kv_read(subjects.KV_PROFILES)  # the profiler's newest table (issue 15)
        pub += _obj_store(OBJ_SNAPSHOTS)  # its pending set's snapshots
        sub += [subjects.TELEMETRY_ALL, subjects.LEDGER_UPDATED]
    elif user == "placer":
        pub += [
            lifecycle,  # Placed, Cancelled, requeues
            f"{subjects.NODE_PREFIX}.>",
            subjects.decisions(user),
            subjects.LEDGER_UPDATED,
        ]
        pub += _stream_update()  # the one service allowed to migrate stream configs
        pub += _consume(subjects.STREAM_LIFECYCLE) + _consume(subjects.STREAM_JOBS)
        pub += _consume(subjects.STREAM_INTENTS)
        pub += _kv_write(subjects.KV_LEDGER) + _kv_write(subjects.KV_LEASES)
        pub += _kv_read(subjects.KV_NODES) + _kv_read(subjects.KV_PROFILES)
        pub += _kv_read(subjects.KV_CORDONS)  # no new placement on a cordoned node
        pub += _kv_read(subjects.KV_SERVICES)  # the inference services it scales (issue 16)
        pub += _obj_store(OBJ_SNAPSHOTS)  # its tracker's snapshots
        sub += [subjects.TELEMETRY_ALL, subjects.EXECUTOR_REPORTS_ALL, subjects.LOAD_ALL]
    elif user == "executor":
        pub += [lifecycle]  # Started, Completed, Failed, Checkpointed, ...
        for n in nodes:  # "*": any node (Kubernetes DaemonSets: node names unknown ahead)
            durable = "*" if n == "*" else f"executor-{n}"
            pub += _consume(subjects.STREAM_NODECMD, durable, f"{subjects.NODE_PREFIX}.{n}.*")
            pub += [subjects.executor_report(n)]
        pub += [f"{JS}.STREAM.INFO.{subjects.STREAM_NODECMD}"]
        pub += [f"{subjects.GANG_PREFIX}.>"]  # a gang's parts start and end together
        sub += [f"{subjects.GANG_PREFIX}.>"]  # (proto.gangs)
    elif user == "telemetry":
        for n in nodes:
            pub += [subjects.telemetry(n), f"$KV.{subjects.KV_NODES}.{n}"]
            sub += [subjects.executor_report(n)]  # sim: an asleep node's GPUs read as off
        pub += _kv_read(subjects.KV_NODES) + _kv_read(subjects.KV_LEDGER)
    elif user == "profiler":
        pub += _consume(subjects.STREAM_LIFECYCLE) + _kv_write(subjects.KV_PROFILES)
        pub += _kv_read(subjects.KV_NODES)  # the GPU model a job completed on
        sub += [subjects.TELEMETRY_ALL]
    elif user in ("defrag", "thermal"):
        pub += [f"{subjects.INTENTS_PREFIX}.{user}", f"{subjects.INTENTS_PREFIX}.{user}.>"]
        pub += [subjects.decisions(user)]
        pub += _kv_read(subjects.KV_LEDGER) + _kv_read(subjects.KV_NODES)
        sub += [subjects.TELEMETRY_ALL]
        if user == "defrag":  # the queue: who waits, and why (the placer's Queued reasons)
            pub += _consume(subjects.STREAM_LIFECYCLE)
    return Permissions(publish=_unique(pub), subscribe=_unique(sub))


def _quote(s: str) -> str:
    return json.dumps(s)


def _list(items: Sequence[str], indent: str) -> str:
    inner = "".join(f"{indent}  {_quote(i)}\n" for i in items)
    return f"[\n{inner}{indent}]"


def authorization_block(
    passwords: dict[str, str], *, nodes: Sequence[str] = (), password_refs: bool = False
) -> str:
    """The nats-server ``authorization { users = [...] }`` block for ``passwords`` (user ->
    password). ``password_refs``: write ``$NATS_PASSWORD_<USER>`` variables instead of the
    values, which nats-server resolves from its environment (compose and Kubernetes secrets)."""
    lines = ["authorization {", "  users = ["]
    for user, password in passwords.items():
        p = permissions(user, nodes=nodes)
        pw = f"$NATS_PASSWORD_{user.upper()}" if password_refs else _quote(password)
        lines += [
            "    {",
            f"      user: {_quote(user)}",
            f"      password: {pw}",
            "      permissions: {",
            f"        publish: {{ allow: {_list(p.publish, '        ')} }}",
            f"        subscribe: {{ allow: {_list(p.subscribe, '        ')} }}",
            "      }",
            "    }",
        ]
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


# --- client side: the keyword arguments a credentials file holds ----------------------------------

# keys of a credentials JSON that are ours, not nats.connect's: they become an ``ssl`` context
TLS_KEYS = ("tls_ca_file", "tls_cert_file", "tls_key_file")


def connect_options(data: dict[str, Any]) -> dict[str, Any]:
    """``nats.connect`` keyword arguments from a credentials JSON object.

    Why a conversion: an ``ssl.SSLContext`` cannot be written to JSON, so a file names the CA
    (and an optional client certificate) and this builds the context. ``inbox_prefix`` stays a
    plain string: it must match the user's ``_INBOX.<user>.>`` subscribe permission.
    """
    opts = {k: v for k, v in data.items() if k not in TLS_KEYS}
    if any(data.get(k) for k in TLS_KEYS):
        ctx = ssl.create_default_context(cafile=data.get("tls_ca_file") or None)
        if data.get("tls_cert_file"):
            ctx.load_cert_chain(data["tls_cert_file"], data.get("tls_key_file") or None)
        opts["tls"] = ctx
    return opts


def load_connect_options(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a credentials file (``MOSAIC_NATS_CREDS``); a missing or bad file stops the caller
    with a message naming it, because connecting anonymously instead would only fail later."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read NATS credentials {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"NATS credentials {path} must be a JSON object")
    return connect_options(data)


DEPLOY_CONF_HEADER = """\
# nats-server configuration for docker-compose.yml and deploy/k8s, GENERATED from the permission
# table in libs/bus/auth.py:   python -m libs.client.credentials conf > deploy/k8s/nats-server.conf
# (a cluster member's, Kubernetes and compose profile nats-cluster: conf --cluster >
# deploy/k8s/nats-cluster.conf)
# Do not edit by hand; tests/security/test_deploy_auth.py fails when it is out of date.
# Passwords are $NATS_PASSWORD_<USER> variables that nats-server reads from its environment:
# compose passes deploy/compose/secrets/nats.env, Kubernetes the Secret mosaic-nats-passwords
# (both made by `python -m libs.client.credentials`). Node agents share the executor and
# telemetry users for any node ("*"): their node names are not known when this is generated.
# TLS: add a block  tls { cert_file: "/etc/nats/tls/tls.crt", key_file: "/etc/nats/tls/tls.key",
# ca_file: "/etc/nats/tls/ca.crt" }  and give every service tls_ca_file in its credentials.
"""

ROUTE_USER = "route"  # the user one cluster member opens a route to another with
ROUTE_PORT = 6222

# Why the routes are a variable: a route URL must carry the route password (the cluster's
# authorization is not used for routes listed explicitly), and nats-server does not expand a
# variable inside a string. It parses a variable's value as config, so $NATS_ROUTES can be a
# whole list; compose's nats.env holds it, Kubernetes composes it in the StatefulSet's env.
DEPLOY_CLUSTER_BLOCK = f"""\
# A member of the 3-server JetStream cluster (R3 streams): server_name from the command line,
# the route password from $NATS_ROUTE_PASSWORD (nats.env; Secret mosaic-nats-route), every
# member's route URL, that password in it, from $NATS_ROUTES (a member ignores its own).
cluster {{
  name: "mosaic"
  listen: "0.0.0.0:{ROUTE_PORT}"
  authorization {{
    user: "{ROUTE_USER}"
    password: $NATS_ROUTE_PASSWORD
  }}
  routes: $NATS_ROUTES
}}
"""


def route_urls(password: str, addresses: Sequence[str]) -> str:
    """The value of ``$NATS_ROUTES``: a route URL with the route user and ``password`` for
    each member's ``host:port``, as a nats-server list."""
    urls = (json.dumps(f"nats-route://{ROUTE_USER}:{password}@{a}") for a in addresses)
    return "[" + ", ".join(urls) + "]"


def deploy_server_conf(nodes: Sequence[str] = ("*",), *, cluster: bool = False) -> str:
    """The complete server config the deployments mount (listen, monitoring, JetStream store,
    users with password variables; with ``cluster``, the routes of a 3-server cluster).
    Monitoring has no authentication: it is reachable only inside the container (compose) or
    from the probes and Prometheus (Kubernetes policies)."""
    users = {u: "" for u in USERS}
    return (
        DEPLOY_CONF_HEADER
        + 'listen: "0.0.0.0:4222"\n'
        + 'http: "0.0.0.0:8222"\n'
        + 'jetstream {\n  store_dir: "/data"\n}\n'
        + (DEPLOY_CLUSTER_BLOCK if cluster else "")
        + authorization_block(users, nodes=nodes, password_refs=True)
    )
