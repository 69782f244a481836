"""NATS authentication and least privilege, on a real nats-server configured as ``mosaic up``
configures it (``libs.bus.auth`` users, ``libs.client.credentials`` files).

Why each test: the issue's forged ``completed`` event freed a running job's GPU; these prove
that a client without a user is refused, that a producer cannot forge lifecycle events or node
commands, that an executor cannot write the ledger or read another node's commands, and that
the whole stack still schedules a job with every service under its own user.
"""

from __future__ import annotations

import asyncio
import json
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest

from libs.bus.auth import inbox_prefix
from libs.bus.connection import Bus
from libs.bus.server import NatsServer, start_nats_server
from libs.client.credentials import Credentials, credentials_dir_of, load_user, read_admin_token
from proto import subjects

NODES = ("n1", "n2")


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[NatsServer, Credentials]]:
    creds = Credentials.generate(tmp_path / "credentials", nodes=NODES)
    server = start_nats_server(tmp_path / "nats", auth=creds.server_authorization())
    creds.write(server.url)
    try:
        yield server, creds
    finally:
        server.stop()


@pytest.fixture
async def admin(secured: tuple[NatsServer, Credentials]) -> AsyncIterator[Bus]:
    """The operator's connection; it creates the topology, as the first service would."""
    server, creds = secured
    bus = await Bus.connect(server.url, "admin", attempts=3, **load_user(creds.directory, "admin"))
    await bus.ensure_topology()
    try:
        yield bus
    finally:
        await bus.close()


class Errors:
    """Collects what the server reports asynchronously (permissions violations)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def cb(self, exc: Exception) -> None:
        self.seen.append(str(exc))

    async def wait_for(self, text: str, timeout_s: float = 3.0) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if any(text.lower() in s.lower() for s in self.seen):
                return True
            await asyncio.sleep(0.02)
        return False


async def _connect(creds: Credentials, user: str, errors: Errors | None = None) -> Any:
    opts = load_user(creds.directory, user)
    return await nats.connect(
        **opts, error_cb=(errors or Errors()).cb, allow_reconnect=False, connect_timeout=2
    )


async def _count(admin: Bus, stream: str, subject: str) -> int:
    info = await admin.js.stream_info(stream, subjects_filter=subject)
    return (info.state.subjects or {}).get(subject, 0)


async def test_a_client_without_credentials_or_with_a_wrong_password_is_refused(
    secured: tuple[NatsServer, Credentials],
) -> None:
    server, creds = secured
    with pytest.raises((nats.errors.Error, OSError)):
        await nats.connect(server.url, allow_reconnect=False, connect_timeout=2)
    wrong = {**load_user(creds.directory, "producer"), "password": "not-the-password"}
    with pytest.raises((nats.errors.Error, OSError)):
        await nats.connect(**wrong, allow_reconnect=False, connect_timeout=2)


async def test_credentials_files_are_private_and_fresh_per_run(
    secured: tuple[NatsServer, Credentials], tmp_path: Path
) -> None:
    _, creds = secured
    assert stat.S_IMODE(creds.directory.stat().st_mode) == 0o700
    for f in creds.directory.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    producer = json.loads((creds.directory / "producer.json").read_text())
    assert producer["user"] == "producer" and len(producer["password"]) >= 43
    assert producer["inbox_prefix"] == inbox_prefix("producer")
    assert len(read_admin_token(creds.directory)) >= 43
    other = Credentials.generate(tmp_path / "other", nodes=NODES)
    assert set(other.passwords.values()).isdisjoint(creds.passwords.values())
    assert other.admin_token != creds.admin_token


async def test_producer_submits_but_cannot_forge_lifecycle_events_or_node_commands(
    secured: tuple[NatsServer, Credentials], admin: Bus
) -> None:
    _, creds = secured
    errors = Errors()
    nc = await _connect(creds, "producer", errors)
    try:
        js = nc.jetstream(timeout=1.0)
        ack = await js.publish(subjects.SUBJECT_SUBMIT, b"{}", headers={"Nats-Msg-Id": "p-1"})
        assert ack.stream == subjects.STREAM_JOBS
        assert await _count(admin, subjects.STREAM_JOBS, subjects.SUBJECT_SUBMIT) == 1

        forged = b'{"type": "completed", "job_id": "victim", "time": 1.0}'
        for subject in (subjects.lifecycle("victim"), subjects.node_command("n1", "kill")):
            with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
                await js.publish(subject, forged)
            await nc.publish(subject, forged)  # core NATS: refused too, reported asynchronously
            assert await errors.wait_for(f'publish to "{subject}"'), errors.seen
        await nc.flush()
        assert await _count(admin, subjects.STREAM_LIFECYCLE, "lifecycle.victim") == 0
        assert await _count(admin, subjects.STREAM_NODECMD, "node.n1.kill") == 0
        # nor can it listen in: not the lifecycle stream, not the services' reply inboxes
        for subject in ("lifecycle.>", f"{inbox_prefix('placer')}.>", "_INBOX.>"):
            await nc.subscribe(subject)
            assert await errors.wait_for(f'subscription to "{subject}"'), errors.seen
    finally:
        await nc.close()


async def test_executor_cannot_write_the_ledger_nor_read_another_nodes_commands(
    secured: tuple[NatsServer, Credentials], admin: Bus
) -> None:
    _, creds = secured
    errors = Errors()
    nc = await _connect(creds, "executor", errors)
    try:
        js = nc.jetstream(timeout=1.0)
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await js.publish(f"$KV.{subjects.KV_LEDGER}.job-1", b"{}")
        assert await errors.wait_for(f"$KV.{subjects.KV_LEDGER}.job-1")
        ledger = await admin.js.key_value(subjects.KV_LEDGER)
        assert (await ledger.status()).values == 0
        # its own node's commands: yes (the placer's run command reaches it) ...
        await admin.js.publish(subjects.node_command("n1", "run"), b"{}")
        mine = await js.pull_subscribe(
            subjects.node_commands("n1"), durable="executor-n1", stream=subjects.STREAM_NODECMD
        )
        assert len(await mine.fetch(1, timeout=2)) == 1
        # ... a node it does not host, or all nodes under its own consumer name: no
        for subject, durable in (("node.n9.*", "executor-n9"), ("node.>", "executor-n2")):
            with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
                await js.pull_subscribe(subject, durable=durable, stream=subjects.STREAM_NODECMD)
        # and it cannot publish node commands itself (only the placer does)
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await js.publish(subjects.node_command("n2", "run"), b"{}")
    finally:
        await nc.close()


async def test_only_the_placer_writes_the_ledger_and_lease(
    secured: tuple[NatsServer, Credentials], admin: Bus
) -> None:
    server, creds = secured
    for user in ("gateway", "scorer", "telemetry", "producer"):
        nc = await _connect(creds, user)
        try:
            js = nc.jetstream(timeout=1.0)
            for subject in (f"$KV.{subjects.KV_LEDGER}.j", f"$KV.{subjects.KV_LEASES}.placer"):
                with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
                    await js.publish(subject, b"{}")
        finally:
            await nc.close()
    placer = await Bus.connect(
        server.url, "placer", attempts=3, **load_user(creds.directory, "placer")
    )
    try:
        kv = await placer.js.key_value(subjects.KV_LEDGER)
        assert await kv.put("j", b"{}") >= 1
    finally:
        await placer.close()


async def test_the_services_with_read_models_save_and_load_their_snapshots(
    secured: tuple[NatsServer, Credentials], admin: Bus
) -> None:
    """The gateway, the scorer and the placer restart from snapshots in the Object Store
    (``libs.bus.snapshot``): each creates the bucket if missing, saves and reads its object
    under its own user, with no permissions violation; a producer cannot write one."""
    from structlog.testing import capture_logs

    from libs.bus.snapshot import SnapshotStore, ensure_snapshot_bucket

    server, creds = secured
    for user in ("gateway", "scorer", "placer"):
        bus = await Bus.connect(server.url, user, attempts=3, **load_user(creds.directory, user))
        try:
            with capture_logs() as logs:
                await ensure_snapshot_bucket(bus)
                store = SnapshotStore(bus, f"{user}.test", subjects.STREAM_LIFECYCLE)
                assert await store.save(0, b"model bytes " * 1000) > 0
                env = await store.load()
                await bus.nc.flush()
                await asyncio.sleep(0.2)  # a violation is reported asynchronously
            assert env is not None and env.body == b"model bytes " * 1000, user
            problems = [e for e in logs if "ermission" in str(e.get("error", ""))]
            assert problems == [], (user, problems)
        finally:
            await bus.close()
    nc = await _connect(creds, "producer")
    try:
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await nc.jetstream(timeout=1.0).publish(f"$O.{subjects.OBJ_SNAPSHOTS}.M.x", b"{}")
    finally:
        await nc.close()


# make test-all; every e2e stack of make test runs under per-service NATS users (start_stack
# auth=True)
@pytest.mark.slow
def test_the_stack_schedules_a_job_with_every_service_under_its_own_user(tmp_path: Path) -> None:
    """``start_stack`` as ``mosaic up`` runs it: auth on, each service its own credentials."""
    from libs.client.supervisor import start_stack
    from libs.policy.inventory import demo_cluster
    from proto.jobs import JobSpec
    from proto.views import TERMINAL_STATES
    from tests.e2e.conftest import require_services, wait_for

    require_services()
    stack = start_stack(demo_cluster(), clock_factor=600.0, data_dir=tmp_path)
    try:
        creds = stack.credentials
        assert creds is not None and credentials_dir_of(tmp_path) == creds.directory
        secrets_ = set(creds.passwords.values()) | {creds.admin_token}
        state_text = (tmp_path / "stack.json").read_text()
        assert not any(s in state_text for s in secrets_), "a secret leaked into stack.json"
        for name, svc in stack.services.items():
            assert svc.env["MOSAIC_NATS_CREDS"] == str(creds.path(name))
            assert not any(s in " ".join(svc.args) for s in secrets_)
            assert ("MOSAIC_ADMIN_TOKEN_FILE" in svc.env) == (name == "gateway")

        async def anonymous_refused_and_producer_accepted() -> None:
            with pytest.raises((nats.errors.Error, OSError)):
                await nats.connect(stack.nats.url, allow_reconnect=False, connect_timeout=2)
            raw = json.loads((creds.directory / "producer.json").read_text())
            nc = await nats.connect(**raw, allow_reconnect=False)  # the file as it is
            try:
                ack = await nc.jetstream().publish(subjects.SUBJECT_CANCEL, b'{"job_id": "x"}')
                assert ack.stream == subjects.STREAM_JOBS
            finally:
                await nc.close()

        asyncio.run(anonymous_refused_and_producer_accepted())
        client = stack.client()
        client.submit(JobSpec(id="auth-1", gpus=1, gpu_mem_gb=8, est_runtime_s=120))

        def done() -> bool:
            return any(j.id == "auth-1" and j.state in TERMINAL_STATES for j in client.jobs())

        wait_for(done, timeout_s=60, what="auth-1 to end", stack=stack)
        assert next(j for j in client.jobs() if j.id == "auth-1").state == "completed"
    finally:
        forced = stack.stop()
    assert not forced, f"services needed SIGKILL under auth: {forced}"
    problems = [
        line
        for log in stack.logs_dir.glob("*.log")
        for line in log.read_text(errors="replace").splitlines()
        if "ermissions" in line and "iolation" in line
    ]
    assert problems == [], "a service was refused a subject it needs:\n" + "\n".join(problems[:10])
