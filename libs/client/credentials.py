"""The credentials ``mosaic up`` generates in ``DATA_DIR/credentials/``.

Why in the data dir: the CLI, a job producer and the tests on the same machine must find them
without being told (``stack.json`` names the folder), and they must be new on every run, so a
file copied from an old run is worth nothing. What is there:

* ``<user>.json`` for every NATS user (``libs.bus.auth.USERS``): the keyword arguments of
  ``nats.connect`` (``servers``, ``user``, ``password``, ``inbox_prefix``, and with TLS the CA
  file), handed to each service as ``MOSAIC_NATS_CREDS``;
* ``producer.json``: the same for a job producer (may publish ``jobs.submit``/``jobs.cancel``);
* ``admin.token``: the HTTP admin bearer token (the gateway reads ``MOSAIC_ADMIN_TOKEN_FILE``).
  Unlike the NATS passwords it is kept across runs (``ensure_admin_token``): the CLI and the
  tenant tokens issued with it keep working after a restart.

Every file is mode 0600 in a 0700 folder: they are passwords.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from libs.bus.auth import (
    ADMIN,
    ROUTE_PORT,
    USERS,
    authorization_block,
    inbox_prefix,
    load_connect_options,
    route_urls,
)

ADMIN_TOKEN_FILE = "admin.token"
PRODUCER_FILE = "producer.json"
SECRET_BYTES = 32  # token_urlsafe(32): 43 characters, 256 bits


def new_secret() -> str:
    """A random URL-safe secret (safe in a URL, a header and a nats-server config string).

    It starts with a letter: the deployments hand passwords to nats-server as environment
    variables, which it parses as config values, and one starting with a digit or ``-`` could
    be read as a number or a size (``12345`` fails the server's start)."""
    while True:
        token = secrets.token_urlsafe(SECRET_BYTES)
        if token[0].isalpha():
            return token


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by the owner only, from the first byte on (no window
    in which a default umask leaves it world-readable)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


@dataclass
class Credentials:
    """One run's secrets. ``passwords`` exist before the server starts (its config needs them);
    the files are written once its address is known (``write``)."""

    directory: Path
    nodes: tuple[str, ...] = ()
    passwords: dict[str, str] = field(default_factory=dict)
    admin_token: str = ""
    tls_ca_file: str | None = None

    @classmethod
    def generate(
        cls, directory: Path, *, nodes: Sequence[str] = (), admin_token: str | None = None
    ) -> Credentials:
        """New NATS passwords; ``admin_token`` kept when given (``mosaic up``), else new."""
        return cls(
            directory=Path(directory),
            nodes=tuple(nodes),
            passwords={u: new_secret() for u in USERS},
            admin_token=admin_token or new_secret(),
        )

    def server_authorization(self) -> str:
        """The ``authorization`` block for ``start_nats_server(auth=...)``."""
        return authorization_block(self.passwords, nodes=self.nodes)

    def path(self, user: str) -> Path:
        return self.directory / f"{user}.json"

    @property
    def admin_token_path(self) -> Path:
        return self.directory / ADMIN_TOKEN_FILE

    def connect_kwargs(self, user: str, url: str) -> dict[str, Any]:
        """What ``<user>.json`` holds: JSON-able ``nats.connect`` keyword arguments."""
        kwargs: dict[str, Any] = {
            "servers": url.split(","),  # a cluster: every server
            "user": user,
            "password": self.passwords[user],
            "inbox_prefix": inbox_prefix(user),
        }
        if self.tls_ca_file:
            kwargs["tls_ca_file"] = self.tls_ca_file
        return kwargs

    def write(self, url: str) -> Path:
        """Write every file for a server at ``url``; returns the folder."""
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        for user in self.passwords:
            text = json.dumps(self.connect_kwargs(user, url), indent=2) + "\n"
            _write_private(self.path(user), text)
        _write_private(self.admin_token_path, self.admin_token + "\n")
        return self.directory


def ensure_admin_token(data_dir: Path | str) -> str:
    """The admin token under ``data_dir``; made (32 random bytes, URL-safe) if there is none.

    Two racing callers end with the same token: the file is created exclusively and the loser
    reads the winner's."""
    folder = Path(data_dir) / "credentials"
    path = folder / ADMIN_TOKEN_FILE
    with contextlib.suppress(OSError):
        token = path.read_text().strip()
        if token:
            return token
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    token = new_secret()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def read_admin_token(directory: str | os.PathLike[str]) -> str:
    """The admin bearer token of a ``mosaic up`` data dir's credentials folder."""
    return (Path(directory) / ADMIN_TOKEN_FILE).read_text().strip()


def load_user(directory: str | os.PathLike[str], user: str) -> dict[str, Any]:
    """``nats.connect`` keyword arguments of ``user`` (TLS files turned into an ssl context)."""
    return load_connect_options(Path(directory) / f"{user}.json")


def credentials_dir_of(data_dir: str | os.PathLike[str]) -> Path | None:
    """The credentials folder a running ``mosaic up`` in ``data_dir`` announced in its
    ``stack.json``; None when there is no stack or it runs without authentication."""
    try:
        state = json.loads((Path(data_dir) / "stack.json").read_text())
    except (OSError, ValueError):
        return None
    found = state.get("credentials_dir") if isinstance(state, dict) else None
    return Path(found) if found else None


def admin_url(url: str, creds: Credentials | None) -> str:
    """``url`` with the admin user and password in it (nats-py reads them from the URL)."""
    if creds is None:
        return url
    parts = []
    for one in url.split(","):
        scheme, rest = one.split("://", 1)
        parts.append(f"{scheme}://{ADMIN}:{creds.passwords[ADMIN]}@{rest}")
    return ",".join(parts)


def service_credentials_env(name: str, creds: Credentials | None) -> dict[str, str]:
    """The variable that hands a service its NATS credentials: the file's path (never the
    secret itself, which ``ps e`` would show). The gateway's admin token file is set apart."""
    if creds is None:
        return {}
    return {"MOSAIC_NATS_CREDS": str(creds.path(name))}


# --- secrets for the deployments: ``python -m libs.client.credentials conf|compose|k8s`` ---------

DEPLOY_NATS_URL = "nats://nats:4222"  # the NATS service's name in compose and Kubernetes
COMPOSE_NATS_MEMBERS = ("nats", "nats-2", "nats-3")  # profile nats-cluster: nats is the first
K8S_NAMESPACE = "mosaic"


def nats_password_env(passwords: dict[str, str]) -> dict[str, str]:
    """The variables the deployments' nats-server config reads (``$NATS_PASSWORD_<USER>``)."""
    return {f"NATS_PASSWORD_{u.upper()}": p for u, p in passwords.items()}


def route_env(password: str, hosts: Sequence[str] = COMPOSE_NATS_MEMBERS) -> dict[str, str]:
    """The route password of a 3-server NATS cluster and its members' route URLs (compose's
    profile nats-cluster; the single server ignores them)."""
    routes = route_urls(password, [f"{h}:{ROUTE_PORT}" for h in hosts])
    return {"NATS_ROUTE_PASSWORD": password, "NATS_ROUTES": routes}


def write_compose_secrets(directory: Path, url: str = DEPLOY_NATS_URL) -> Credentials:
    """``deploy/compose/secrets/``: ``<user>.json``, ``admin.token`` and ``nats.env`` (the
    users' passwords, and the route password and routes of the ``nats-cluster`` profile).

    The folder is 0700 but the files 0644: compose bind-mounts each secret file as it is, and
    the services run as uid 10001, not as the host user who made them."""
    creds = Credentials.generate(directory)
    creds.write(url)
    values = nats_password_env(creds.passwords) | route_env(new_secret())
    env = "".join(f"{k}={v}\n" for k, v in values.items())
    _write_private(directory / "nats.env", env)
    for f in directory.iterdir():
        os.chmod(f, 0o644)
    return creds


def k8s_secrets(namespace: str = K8S_NAMESPACE, url: str = DEPLOY_NATS_URL) -> str:
    """Secret manifests with fresh values, to pipe into ``kubectl apply -f -``: one
    ``mosaic-nats-<user>`` per user (key ``creds.json``), ``mosaic-nats-passwords`` for the
    server's environment, ``mosaic-nats-route`` (the cluster overlay's route password) and
    ``mosaic-admin-token`` (key ``token``). Printed, never stored."""
    creds = Credentials(directory=Path("."), passwords={u: new_secret() for u in USERS})
    creds.admin_token = new_secret()

    def secret(name: str, data: dict[str, str]) -> str:
        items = "".join(f"  {k}: {json.dumps(v)}\n" for k, v in data.items())
        return (
            "---\napiVersion: v1\nkind: Secret\ntype: Opaque\n"
            f"metadata:\n  name: {name}\n  namespace: {namespace}\n"
            "  labels:\n    app.kubernetes.io/part-of: mosaic\n"
            f"stringData:\n{items}"
        )

    docs = [secret("mosaic-nats-passwords", nats_password_env(creds.passwords))]
    # the overlay deploy/k8s/overlays/cluster reads it (routes between the three members)
    docs.append(secret("mosaic-nats-route", {"NATS_ROUTE_PASSWORD": new_secret()}))
    for user in creds.passwords:
        kwargs = json.dumps(creds.connect_kwargs(user, url))
        docs.append(secret(f"mosaic-nats-{user}", {"creds.json": kwargs}))
    docs.append(secret("mosaic-admin-token", {"token": creds.admin_token}))
    return "".join(docs)


def main(argv: Sequence[str] | None = None) -> int:
    """``conf [--cluster] [NODE ...]``: the deployments' nats-server config (a member of the
    3-server cluster's with ``--cluster``); ``compose [DIR]``: compose's
    secret files (default deploy/compose/secrets); ``k8s [NAMESPACE]``: Secret manifests."""
    import sys

    from libs.bus.auth import deploy_server_conf

    args = list(argv if argv is not None else sys.argv[1:])
    what, rest = (args[0], args[1:]) if args else ("", [])
    if what == "conf":
        cluster = "--cluster" in rest
        nodes = [n for n in rest if n != "--cluster"] or ["*"]
        sys.stdout.write(deploy_server_conf(nodes, cluster=cluster))
    elif what == "compose":
        folder = Path(rest[0] if rest else "deploy/compose/secrets")
        write_compose_secrets(folder)
        print(f"wrote {folder}/ (nats.env, admin.token, one <user>.json per NATS user)")
    elif what == "k8s":
        sys.stdout.write(k8s_secrets(rest[0] if rest else K8S_NAMESPACE))
    else:
        print(main.__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
