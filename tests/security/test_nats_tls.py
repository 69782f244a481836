"""TLS as an option: a server started with (cert, key, CA) accepts a client that verifies it
against the CA and refuses a plain one; the whole stack runs over it.

Why a generated CA and not a checked-in one: a key in the repository would teach copying it.
The certificates are made with the machine's ``openssl`` in a temporary folder; without
``openssl`` the tests are skipped and say so.
"""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
from pathlib import Path

import nats
import nats.errors
import pytest

from libs.bus.server import start_nats_server
from libs.client.credentials import Credentials, load_user

OPENSSL = shutil.which("openssl")
pytestmark = pytest.mark.skipif(OPENSSL is None, reason="openssl not on PATH: no test certificates")


def make_certs(folder: Path) -> tuple[Path, Path, Path]:
    """A throw-away CA and a server certificate for 127.0.0.1/localhost, valid one day."""
    assert OPENSSL is not None
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        subprocess.run([OPENSSL, *args], cwd=folder, check=True, capture_output=True)

    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
        "-subj", "/CN=mosaic-test-ca")  # fmt: skip
    run("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (folder / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "1", "-extfile", "san.cnf")  # fmt: skip
    return folder / "server.pem", folder / "server.key", folder / "ca.pem"


async def test_a_client_that_trusts_the_ca_connects_and_a_plain_one_is_refused(
    tmp_path: Path,
) -> None:
    cert, key, ca = make_certs(tmp_path)
    creds = Credentials.generate(tmp_path / "credentials")
    creds.tls_ca_file = str(ca)
    with start_nats_server(
        tmp_path / "nats", auth=creds.server_authorization(), tls=(cert, key, ca)
    ) as server:
        assert server.url.startswith("tls://")
        creds.write(server.url)
        assert json.loads(creds.path("producer").read_text())["tls_ca_file"] == str(ca)
        opts = load_user(creds.directory, "producer")
        assert isinstance(opts["tls"], ssl.SSLContext)
        nc = await nats.connect(**opts, allow_reconnect=False, connect_timeout=2)
        try:
            assert nc.is_connected
            await nc.publish("jobs.submit", b"{}")  # allowed to the producer
            await nc.flush(timeout=2)  # a full round trip over the TLS session
        finally:
            await nc.close()
        plain = f"nats://127.0.0.1:{server.port}"
        no_ca = {k: v for k, v in opts.items() if k not in ("tls", "servers")}
        for kwargs in ({"servers": [plain]}, {"servers": [plain], **no_ca}):
            with pytest.raises((nats.errors.Error, OSError, ssl.SSLError)):
                await nats.connect(**kwargs, allow_reconnect=False, connect_timeout=2)


def test_the_stack_runs_over_tls(tmp_path: Path) -> None:
    from libs.client.supervisor import start_stack
    from libs.policy.inventory import demo_cluster
    from proto.jobs import JobSpec
    from proto.views import TERMINAL_STATES
    from tests.e2e.conftest import require_services, wait_for

    require_services()
    certs = make_certs(tmp_path)
    stack = start_stack(demo_cluster()[:2], clock_factor=600.0, data_dir=tmp_path / "d", tls=certs)
    try:
        assert stack.nats.url.startswith("tls://")
        client = stack.client()
        client.submit(JobSpec(id="tls-1", gpus=1, gpu_mem_gb=8, est_runtime_s=120))

        def done() -> bool:
            return any(j.id == "tls-1" and j.state in TERMINAL_STATES for j in client.jobs())

        wait_for(done, timeout_s=60, what="tls-1 to end", stack=stack)
    finally:
        stack.stop()
