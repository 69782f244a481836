"""The admin bearer token of a local stack, ``DATA_DIR/credentials/admin.token``.

Why a file in the data dir: ``mosaic up``, the CLI and the tests on the same machine find it
without a flag, and file permissions (0600 in a 0700 folder) keep other users of the machine
out. The gateway reads the same file (``--admin-token-file``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def ensure_admin_token(data_dir: Path | str) -> str:
    """The admin token under ``data_dir``; made (32 random bytes, URL-safe) if there is none.

    Two racing callers end with the same token: the file is created exclusively and the loser
    reads the winner's."""
    folder = Path(data_dir) / "credentials"
    path = folder / "admin.token"
    with contextlib.suppress(OSError):
        token = path.read_text().strip()
        if token:
            return token
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token
