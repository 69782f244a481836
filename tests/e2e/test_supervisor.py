"""The supervisor on its own: children in their own sessions, kill/restart, a clean stop that
leaves no PID behind, and a clear error naming the log when a service dies at start."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from libs.client.api import ClientError
from libs.client.supervisor import StackError, start_stack
from libs.policy.inventory import demo_cluster
from tests.e2e.conftest import ROOT


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_gateway_alone_kill_restart_and_stop_leaves_nothing(tmp_path: Path) -> None:
    if not (ROOT / "services" / "gateway" / "__main__.py").is_file():
        pytest.skip("services/gateway/__main__.py not present yet")
    stack = start_stack(demo_cluster(), data_dir=tmp_path, services=("gateway",), wait=False)
    with stack:
        client = stack.client()
        deadline = time.monotonic() + 60
        while True:
            try:
                assert client.health()["status"] == "ok"
                break
            except ClientError:
                assert stack.alive()["gateway"], stack.services["gateway"].tail()
                assert time.monotonic() < deadline, "gateway never answered /healthz"
                time.sleep(0.2)
        # children run in their own session: a terminal's Ctrl-C never reaches them directly
        gw = stack.services["gateway"]
        assert os.getsid(gw.pid) == gw.pid != os.getsid(0)
        first_pid = gw.pid
        stack.kill("gateway")
        assert not stack.alive()["gateway"] and stack.alive()["nats"]
        stack.restart("gateway")
        assert gw.pid != first_pid and stack.alive()["gateway"]
        pids = stack.pids()
        nats_port = stack.nats.port
    assert stack.stopped
    assert all(_gone(pid) for pid in pids.values()), pids
    assert not _port_open(nats_port)
    assert (tmp_path / "logs" / "gateway.log").read_text().count("--- start gateway") == 2


def test_a_service_that_dies_at_start_is_named_with_its_log(tmp_path: Path) -> None:
    with pytest.raises(StackError) as info:
        start_stack(demo_cluster(), data_dir=tmp_path, services=("nosuch",), ready_timeout_s=20)
    text = str(info.value)
    assert "nosuch exited" in text and str(tmp_path / "logs" / "nosuch.log") in text
    assert len(text.splitlines()) == 1
    assert "No module named services.nosuch" in info.value.log_tail
