"""``mosaic up``'s supervision: a child that exits is restarted with backoff and said so, one whose
/healthz keeps failing is replaced, NATS is restarted on its port and store, and a child that
keeps dying stops the stack with the log named. Real processes and a real nats-server."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from libs.bus.server import NatsServer, free_port
from libs.client.child import Service
from libs.client.restarts import GiveUp, Restarter, RestartPolicy
from libs.client.supervisor import Stack, StackError, start_stack
from libs.clock import Clock
from libs.obs.health import Health, ObsServer
from libs.policy.inventory import demo_cluster
from tests.e2e._up_process import UpProcess, stack_state
from tests.e2e.conftest import require_services

QUICK = RestartPolicy(first_backoff_s=0.05, max_backoff_s=0.2, unhealthy_after_s=0.3)


def _supervise_until(stack: Stack, want: str, timeout_s: float = 30.0) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while not any(want in line for line in lines):
        assert time.monotonic() < deadline, f"no {want!r} in {lines}"
        lines += stack.supervise()
        time.sleep(0.05)
    return lines


def test_backoff_doubles_resets_after_a_good_run_and_gives_up_in_a_burst():
    r = Restarter(RestartPolicy(first_backoff_s=1, max_backoff_s=4, max_restarts=5, window_s=60))
    dues = []
    for t in (0.0, 2.0, 5.0, 10.0):
        dues.append(r.exited("placer", now=t, ran_s=0.5, reason="exit code 1") - t)
        assert not r.due("placer", t) and r.due("placer", dues[-1] + t)
        r.restarting("placer", t)
    assert dues == [1, 2, 4, 4]  # doubling, capped
    assert r.exited("placer", now=100.0, ran_s=70, reason="exit code -9") == 101.0  # reset
    r.restarting("placer", 100.0)
    r.exited("placer", now=101.0, ran_s=0.1, reason="x")
    for t in (102.0, 103.0, 104.0, 105.0):
        r.restarting("placer", t)
        if t < 105.0:
            r.exited("placer", now=t, ran_s=0.1, reason="x")
    with pytest.raises(GiveUp, match=r"placer failed again .* 5 restarts within 60 s"):
        r.exited("placer", now=106.0, ran_s=0.1, reason="exit code 1")


def test_unhealthy_counts_only_when_it_lasts():
    r = Restarter(RestartPolicy(unhealthy_after_s=10))
    assert not r.unhealthy("gw", now=0.0, problem="loop wedged")
    assert not r.unhealthy("gw", now=5.0, problem=None)  # recovered: the clock restarts
    assert not r.unhealthy("gw", now=6.0, problem="loop wedged")
    assert r.unhealthy("gw", now=16.0, problem="loop wedged")


def test_a_killed_service_is_restarted_and_said_so(tmp_path: Path) -> None:
    stack = start_stack(demo_cluster(), data_dir=tmp_path, services=("gateway",), wait=False)
    with stack:
        stack.restarter = Restarter(QUICK)
        assert stack.supervise() == []
        first = stack.services["gateway"].pid
        stack.kill("gateway")
        lines = _supervise_until(stack, "restarted gateway")
        assert lines == ["restarted gateway (exit code -9, restart 1)"]
        assert stack.alive()["gateway"] and stack.services["gateway"].pid != first
        assert '"gateway": 1' in (tmp_path / "stack.json").read_text()


def test_a_service_that_keeps_dying_stops_the_stack_naming_its_log(tmp_path: Path) -> None:
    stack = start_stack(demo_cluster(), data_dir=tmp_path, services=("nosuch",), wait=False)
    with stack:
        stack.restarter = Restarter(RestartPolicy(first_backoff_s=0.05, max_restarts=3))
        with pytest.raises(StackError) as info:
            _supervise_until(stack, "never", timeout_s=30)
    text = str(info.value)
    assert "nosuch failed again (exit code 1) after 3 restarts" in text
    assert "giving up" in text and str(tmp_path / "logs" / "nosuch.log") in text
    assert stack.failure == text
    assert "No module named services.nosuch" in info.value.log_tail
    log = (tmp_path / "logs" / "nosuch.log").read_text()
    assert log.count("--- start nosuch") == 4


def test_unhealthy_child_is_replaced_and_nats_is_restarted(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    health = Health("sleeper")
    wedged = {"on": True}
    health.register("loop", lambda: "wedged: no progress" if wedged["on"] else None)
    obs = ObsServer(health, 0)
    svc = Service(
        name="sleeper",
        args=[sys.executable, "-c", "import time; time.sleep(120)"],
        env={},
        log_path=tmp_path / "logs" / "sleeper.log",
        metrics_port=obs.port,
    )
    stack = Stack(
        nodes=[],
        clock=Clock(epoch=time.time()),
        data_dir=tmp_path,
        nats=nats_server,
        gateway_port=0,
        services={"sleeper": svc},
        restarter=Restarter(QUICK),
    )
    try:
        svc.start()
        lines = _supervise_until(stack, "restarted sleeper")
        assert lines == ["restarted sleeper (unhealthy: loop: wedged: no progress, restart 1)"]
        wedged["on"] = False
        assert stack.supervise() == []
        port = stack.nats.port
        stack.nats.process.kill()
        stack.nats.process.wait()
        lines = _supervise_until(stack, "restarted nats")
        assert lines == ["restarted nats (exit code -9)"]
        assert stack.alive()["nats"] and stack.nats.port == port
    finally:
        obs.close()
        stack.stop()


def test_mosaic_up_restarts_a_sigkilled_placer_and_says_so(tmp_path: Path) -> None:
    require_services()
    port = free_port()
    up = UpProcess("--nodes", "3", "--duration", "90", "--port", str(port),
                   "--data-dir", str(tmp_path))  # fmt: skip
    try:
        up.wait_for("metrics    placer", 90)  # started and ready
        placer = stack_state(tmp_path)["pids"]["placer"]
        os.kill(placer, signal.SIGKILL)
        up.wait_for("restarted placer (exit code -9, restart 1)", 90)
        state = stack_state(tmp_path)
        assert state["pids"]["placer"] != placer and state["restarts"]["placer"] == 1
        code = up.interrupt()
    finally:
        up.kill_if_running()
    assert code == 0, up.text()
