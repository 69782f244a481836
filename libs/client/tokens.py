"""Which bearer token a client on this machine sends, when none is given in code.

Order: an explicit token (``--token`` or ``MOSAIC_TOKEN``), else the file named by
``MOSAIC_TOKEN_FILE``, else - only for a gateway on this machine (loopback) - the admin token of
the local ``mosaic up`` (``DATA_DIR/credentials/admin.token``, the data dir from
``MOSAIC_DATA_DIR`` or ``.mosaic``, or the file or credentials folder its ``stack.json``
names). Why loopback only: the local admin token must never be sent to a gateway somewhere
else, which could then act as the operator of this one. So ``make run`` and the README tour
need no extra step.
"""

from __future__ import annotations

import ipaddress
import json
import os
import urllib.parse
from pathlib import Path

_LOCAL_NAMES = ("localhost", "localhost.localdomain")


def admin_token_file(data_dir: Path | str) -> Path:
    return Path(data_dir) / "credentials" / "admin.token"


def is_local(url: str) -> bool:
    """Is the gateway at ``url`` on this machine?"""
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    if host in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _read(path: Path | str) -> str | None:
    try:
        token = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return token or None


def local_admin_token(data_dir: Path | str | None = None) -> str | None:
    """The admin token a local ``mosaic up`` wrote, if there is one."""
    folder = Path(data_dir or os.environ.get("MOSAIC_DATA_DIR") or ".mosaic")
    try:
        state = json.loads((folder / "stack.json").read_text())
    except (OSError, ValueError):
        state = {}
    state = state if isinstance(state, dict) else {}
    named = [state.get("admin_token_file")]
    if isinstance(state.get("credentials_dir"), str):
        named.append(str(Path(state["credentials_dir"]) / "admin.token"))
    for path in named:
        if isinstance(path, str) and (token := _read(path)):
            return token
    return _read(admin_token_file(folder))


def find_token(gateway: str, explicit: str | None = None) -> str | None:
    """The token to send to ``gateway`` (see the module for the order); None: none found."""
    if explicit:
        return explicit
    if env := os.environ.get("MOSAIC_TOKEN"):
        return env
    if path := os.environ.get("MOSAIC_TOKEN_FILE"):
        return _read(path)
    return local_admin_token() if is_local(gateway) else None
