"""Shared fixtures. Integration tests run against a real nats-server started here, never a mock."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from libs.bus.server import NatsServer, start_nats_server

# CI runs each property test on a fixed, reproducible set of examples: a failure there must be
# reproducible from the log, and a rare example found locally is recorded in .hypothesis/ and
# replayed on the machine that found it. Locally, examples stay random to keep exploring.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces"


@pytest.fixture(scope="session", autouse=True)
def compiled_loops() -> None:
    """Compile the pass's numba loops once, into their on-disk cache, before any test starts
    services: on a fresh clone every service process would otherwise compile them itself, at
    once, and a placer busy compiling for a minute fails tests that time its recovery (the
    chaos test's 90 s). Production images warm the cache the same way (``NUMBA_CACHE_DIR``)."""
    from libs.policy.warmup import warm_up

    warm_up()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A fresh nats-server with JetStream in a temporary directory, per test."""
    server = start_nats_server(tmp_path / "nats")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    return nats_server.url


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    """../shared/traces; tests that need it skip with a clear reason when it is absent."""
    if not TRACES.is_dir():
        pytest.skip(f"public traces not available at {TRACES} (only present beside the checkout)")
    return TRACES
