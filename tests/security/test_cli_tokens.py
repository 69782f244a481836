"""Which token the client and the CLI send, and ``mosaic tenant add|list|delete`` against the real
gateway on a real nats-server.

The local admin token is found without a flag (``make run`` and the README tour stay two
commands), but it is never sent to a gateway on another machine.
"""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import pytest

from libs.client.api import ClientError, MosaicClient
from libs.client.cli import main
from libs.client.credentials import ensure_admin_token
from libs.client.tokens import find_token, is_local
from tests.services._gateway_auth import ADMIN_TOKEN
from tests.services.test_gateway import gateway


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No token in the environment; the data dir is an empty ``tmp_path``."""
    for var in ("MOSAIC_TOKEN", "MOSAIC_TOKEN_FILE", "MOSAIC_GATEWAY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MOSAIC_DATA_DIR", str(tmp_path))
    return tmp_path


def test_ensure_admin_token_makes_one_private_token_and_keeps_it(tmp_path: Path) -> None:
    token = ensure_admin_token(tmp_path)
    path = tmp_path / "credentials" / "admin.token"
    assert len(token) >= 43 and path.read_text().strip() == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert ensure_admin_token(tmp_path) == token  # a second start keeps the operator's token
    assert ensure_admin_token(tmp_path / "other") != token


def test_token_order_and_the_local_admin_token_only_for_a_local_gateway(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local, remote = "http://127.0.0.1:8080", "http://gateway.example.com:8080"
    assert find_token(local) is None  # nothing anywhere
    admin = ensure_admin_token(clean_env)
    assert find_token(local) == admin
    assert find_token("http://localhost:9") == admin and find_token("http://[::1]:9") == admin
    assert find_token(remote) is None  # never the local admin token to another machine
    assert not is_local(remote) and is_local("http://127.0.0.2:1")
    token_file = clean_env / "mine.token"
    token_file.write_text("from-file\n")
    monkeypatch.setenv("MOSAIC_TOKEN_FILE", str(token_file))
    assert find_token(local) == find_token(remote) == "from-file"
    monkeypatch.setenv("MOSAIC_TOKEN", "from-env")
    assert find_token(remote) == "from-env"
    assert find_token(remote, "explicit") == "explicit"


def test_stack_json_may_name_the_admin_token_file(clean_env: Path) -> None:
    elsewhere = clean_env / "secrets" / "admin"
    elsewhere.parent.mkdir()
    elsewhere.write_text("named-in-stack-json\n")
    (clean_env / "stack.json").write_text(f'{{"admin_token_file": "{elsewhere}"}}')
    assert find_token("http://127.0.0.1:8080") == "named-in-stack-json"
    (elsewhere.parent / "admin.token").write_text("in-credentials-dir\n")
    (clean_env / "stack.json").write_text(f'{{"credentials_dir": "{elsewhere.parent}"}}')
    assert find_token("http://127.0.0.1:8080") == "in-credentials-dir"


async def test_tenant_commands_and_the_token_a_command_sends(
    nats_url: str,
    clean_env: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def run(*args: str) -> int:
        return main(list(args))

    async with gateway(nats_url) as base:
        # no token at all: one line saying what to do, exit 1
        assert await asyncio.to_thread(run, "queue", "--gateway", base) == 1
        err = capsys.readouterr().err
        assert "MOSAIC_TOKEN" in err and len(err.strip().splitlines()) == 1

        code = await asyncio.to_thread(
            run, "--token", ADMIN_TOKEN, "tenant", "add", "ml", "--may-run-commands",
            "--gateway", base,
        )  # fmt: skip
        assert code == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].split() == ["tenant", "ml"] and "may run commands" in lines[-1]
        token = lines[1].split()[1]

        monkeypatch.setenv("MOSAIC_TOKEN", ADMIN_TOKEN)  # the env var works like --token
        assert await asyncio.to_thread(run, "tenant", "list", "--gateway", base) == 0
        monkeypatch.delenv("MOSAIC_TOKEN")
        listing = capsys.readouterr().out
        assert "ml" in listing and "yes" in listing and token not in listing

        # the tenant's token submits as the tenant (the --tenant default is overridden)
        args = ("--token", token, "submit", "--id", "ml-1", "--gateway", base)
        assert await asyncio.to_thread(run, *args) == 0
        assert capsys.readouterr().out.strip() == "ml-1"
        job = await asyncio.to_thread(MosaicClient(base, token=ADMIN_TOKEN).job, "ml-1")
        assert job.tenant == "ml"
        args = ("--token", token, "submit", "--id", "ml-2", "--command", "true", "--gateway", base)
        assert await asyncio.to_thread(run, *args) == 0  # ml may run commands
        # a command from a tenant not allowed to run one: refused like an invalid job, exit 2
        admin = MosaicClient(base, token=ADMIN_TOKEN)
        plain = (await asyncio.to_thread(admin.create_tenant, "plain")).token
        args = ("--token", plain, "submit", "--command", "id", "--gateway", base)
        assert await asyncio.to_thread(run, *args) == 2
        assert "command" in capsys.readouterr().err
        # a tenant may not manage tenants: the 403 is one line, exit 1
        args = ("--token", token, "tenant", "add", "x", "--gateway", base)
        assert await asyncio.to_thread(run, *args) == 1
        assert "admin" in capsys.readouterr().err

        args = ("--token", ADMIN_TOKEN, "tenant", "delete", "ml", "--gateway", base)
        assert await asyncio.to_thread(run, *args) == 0
        with pytest.raises(ClientError) as info:
            await asyncio.to_thread(MosaicClient(base, token=token).jobs)
        assert info.value.status == 401
