"""``mosaic cordon`` / ``mosaic uncordon`` through the real gateway on a real nats-server: the
commands parse, send the admin token, write (and delete) the KV record, print one line, and
``mosaic nodes`` shows the node draining with the reason. Refusals are one line, exit 1."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from libs.bus import Bus
from libs.client import cli
from libs.client.cli import main
from proto import subjects
from proto.cordons import Cordon
from tests.services._gateway_auth import ADMIN_TOKEN
from tests.services._scorer_util import poll, put_nodes
from tests.services.test_cordon_stack import T4, V100, _nodes
from tests.services.test_gateway import gateway
from tests.services.test_placer import small_cluster


@pytest.fixture(autouse=True)
def no_local_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No token from the environment or from a `mosaic up` in the working directory."""
    for var in ("MOSAIC_TOKEN", "MOSAIC_TOKEN_FILE", "MOSAIC_GATEWAY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MOSAIC_DATA_DIR", str(tmp_path / "no-stack"))


async def _mosaic(*args: str) -> int:
    return await asyncio.to_thread(main, list(args))  # the CLI is synchronous (urllib)


async def test_cordon_and_uncordon_commands_drive_the_api(
    nats_url, bus: Bus, http, capsys, monkeypatch
):
    # the nodes table is wider than 80 columns; the console's width is fixed when it is made
    # wherever COLUMNS was set then (pytest-xdist's workers set it), so set the console's own
    monkeypatch.setattr(cli.out, "width", 200)
    await put_nodes(bus, small_cluster())
    cordons = await bus.kv(subjects.KV_CORDONS, Cordon)
    async with gateway(nats_url) as base:
        await poll(lambda: _nodes(http, base))
        token = ("--token", ADMIN_TOKEN)
        code = await _mosaic(
            *token, "cordon", V100, "--reason", "[red]fan[/red]", "--gateway", base
        )
        assert code == 0
        assert capsys.readouterr().out.strip() == f"{V100}: cordoned ([red]fan[/red])"
        entry = await cordons.get(V100)
        assert entry is not None and entry.value.by == "admin"
        assert entry.value.reason == "[red]fan[/red]"  # operator text, kept as typed

        assert await _mosaic(*token, "nodes", "--gateway", base) == 0
        rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
        assert "drain" in rows[V100] and "[red]fan[/red]" in rows[V100]  # not rich markup
        assert "drain" not in rows[T4]

        assert await _mosaic(*token, "uncordon", V100, "--gateway", base) == 0
        assert capsys.readouterr().out.strip() == f"{V100}: uncordoned"
        assert await cordons.get(V100) is None

        assert await _mosaic(*token, "cordon", "no-such-node", "--gateway", base) == 1
        assert "unknown node 'no-such-node'" in capsys.readouterr().err
        assert await _mosaic("cordon", V100, "--gateway", base) == 1  # no token found
        err = capsys.readouterr().err
        assert "authentication required" in err and "--token" in err and err.count("\n") == 1
        assert await cordons.items() == {}


def test_cordon_flags_parse_before_any_request(capsys) -> None:
    assert main(["cordon"]) == 2  # NODE is required
    assert "Missing argument" in capsys.readouterr().err
    assert main(["uncordon", "n1", "--reason", "x"]) == 2  # uncordon takes no reason
    assert "--reason" in capsys.readouterr().err
