"""The admin token every in-process gateway of the tests is started with, as a file (what
``mosaic up`` writes to ``DATA_DIR/credentials/admin.token``), and the header that sends it."""

from __future__ import annotations

import tempfile
from pathlib import Path

ADMIN_TOKEN = "test-admin-token-0123456789abcdef"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def admin_token_file() -> Path:
    """A fresh file holding ADMIN_TOKEN (the gateway's ``--admin-token-file``)."""
    folder = Path(tempfile.mkdtemp(prefix="mosaic-cred-"))
    (folder / "admin.token").write_text(ADMIN_TOKEN + "\n")
    return folder / "admin.token"
