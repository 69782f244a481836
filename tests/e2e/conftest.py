"""The end-to-end fixture: the real stack (nats-server + every service as a child process),
started by ``libs.client.supervisor`` exactly as ``mosaic up`` starts it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from libs.client.api import MosaicClient
from libs.client.supervisor import SERVICES, Stack, start_stack
from libs.policy.inventory import demo_cluster
from proto.views import TERMINAL_STATES

# Fast Mosaic time: a 10-minute job lasts a wall second.
E2E_CLOCK_FACTOR = 600.0


ROOT = Path(__file__).resolve().parents[2]


def missing_services() -> list[str]:
    return [s for s in SERVICES if not (ROOT / "services" / s / "__main__.py").is_file()]


def require_services() -> None:
    missing = missing_services()
    if missing:
        pytest.skip(f"services not yet runnable (no services/<name>/__main__.py): {missing}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One stack per test module (starting one costs seconds on a 2-core machine)."""
    require_services()
    data_dir = tmp_path_factory.mktemp("stack")
    s = start_stack(demo_cluster(), clock_factor=E2E_CLOCK_FACTOR, data_dir=data_dir)
    try:
        yield s
    finally:
        forced = s.stop()
        left = [n for n, s_ in s.services.items() if s_.alive()]
        assert not left, f"services left running: {left}"
        assert not forced, f"services needed SIGKILL to stop: {forced} (logs in {s.logs_dir})"


@pytest.fixture
def client(stack: Stack) -> MosaicClient:
    return stack.client()


def wait_for(
    predicate: Callable[[], object], *, timeout_s: float, what: str, stack: Stack | None = None
) -> object:
    """Poll ``predicate`` until truthy; fail naming ``what`` (and a dead service, if any)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if stack is not None and stack.dead():
            dead = stack.dead()[0]
            pytest.fail(
                f"{dead.name} died while waiting for {what}; {dead.log_path}:\n{dead.tail()}"
            )
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.25)


def all_terminal(client: MosaicClient, ids: set[str]) -> Callable[[], bool]:
    def check() -> bool:
        states = {j.id: j.state for j in client.jobs()}
        return all(states.get(i) in TERMINAL_STATES for i in ids)

    return check
