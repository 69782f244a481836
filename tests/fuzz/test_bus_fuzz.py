"""Bus fuzzing (issue 12): generated garbage on every subject a service consumes, typed with the
real ``proto`` types, against a real nats-server.

Each example is one message — deep nesting, huge and non-finite numbers, wrong types, bytes that
are not UTF-8, empty, oversized, truncated or mutated real messages, and real messages too —
published on one target (a JetStream consumer, a core subscription or a KV watch). The harness
waits until the bus has either handed it to the handler or dead-lettered it, and checks which: a
message the decoder (within the bus's limits) rejects must be a dead letter, any other must reach
the handler. At the end: every loop is alive (a valid message on each is still handled), the DLQ
stream holds one letter per bad message, and the service health is ok.

``make test`` runs a short version; the ``slow`` one (``make test-all``) does 10,000 per target.
Its counts are in docs/benchmarks.md ("Fuzzing (bus)").
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from prometheus_client import REGISTRY

from libs.bus import Bus
from libs.bus.receive import guarded_decode, make_decoder
from libs.bus.server import NatsServer, start_nats_server
from proto import subjects
from tests.fuzz.bus_inputs import LIMITS, TARGETS, Target, garbage

R = TypeVar("R")


# --- harness --------------------------------------------------------------------------------


@dataclass
class Harness:
    """A nats-server and a Bus whose loops run in a thread of their own, so hypothesis (which
    is synchronous) can drive them one example at a time."""

    store: Path
    server: NatsServer | None = None
    bus: Bus | None = None
    service: str = field(default_factory=lambda: f"fuzz-{uuid.uuid4().hex[:8]}")
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    kvs: dict[str, Any] = field(default_factory=dict)
    decoders: dict[str, Callable[[str, bytes], Any]] = field(default_factory=dict)

    def run(self, coro: Coroutine[Any, Any, R], timeout_s: float = 30.0) -> R:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def start(self) -> None:
        threading.Thread(target=self.loop.run_forever, name="fuzz-bus", daemon=True).start()
        self.server = start_nats_server(self.store)
        self.run(self._setup())

    async def _setup(self) -> None:
        assert self.server is not None
        self.bus = bus = await Bus.connect(self.server.url, self.service)
        bus.limits = LIMITS
        await bus.ensure_topology()
        for t in TARGETS:
            self.decoders[t.name] = make_decoder(t.type_)

            async def handler(_value: Any, t: Target = t) -> None:
                t.handled += 1

            if t.kind == "durable":
                await bus.consume(t.stream, t.pattern, t.type_, handler, durable=t.name)
            elif t.kind == "core":
                await bus.subscribe(t.pattern, t.type_, handler)
            else:
                kv = await bus.kv(t.pattern, t.type_)
                self.kvs[t.name] = kv

                async def on_change(_key: str, _v: Any, t: Target = t) -> None:
                    t.handled += 1

                await kv.watch(on_change)

    def dead(self, t: Target) -> int:
        labels = {"service": self.service, "subject": t.dead_label}
        return int(REGISTRY.get_sample_value("mosaic_dead_letters_total", labels) or 0)

    def send(self, t: Target, subject: str, data: bytes) -> None:
        """Publish one example and wait until the bus handled or dead-lettered it."""
        _, rejected = guarded_decode(LIMITS, lambda d: self.decoders[t.name](subject, d), data)
        bad_before, handled_before = self.dead(t), t.handled
        t.sent += 1
        t.bad += rejected is not None
        self.run(self._publish(t, subject, data))
        deadline = time.monotonic() + 20.0
        while self.dead(t) + t.handled < bad_before + handled_before + 1:
            assert time.monotonic() < deadline, f"{t.name}: example neither handled nor dead"
            time.sleep(0.0005)
        # the right one of the two, and only once
        assert (self.dead(t) - bad_before, t.handled - handled_before) == (
            (1, 0) if rejected else (0, 1)
        ), (t.name, subject, data[:200], rejected)

    async def _publish(self, t: Target, subject: str, data: bytes) -> None:
        assert self.bus is not None
        if t.kind == "durable":
            await self.bus.js.publish(subject, data)
        elif t.kind == "core":
            await self.bus.nc.publish(subject, data)
            await self.bus.nc.flush()
        else:
            await self.kvs[t.name].raw.put(subject, data)

    def finish(self) -> dict[str, tuple[int, int]]:
        """A valid message through every target (its loop is alive), then the DLQ and health
        checks; returns {target: (sent, dead letters)}."""
        for t in TARGETS:
            self.send(t, t.home, msgspec.json.encode(t.samples[0]))
        assert self.bus is not None
        info = self.run(self.bus.js.stream_info(subjects.STREAM_DLQ))
        total_bad = sum(t.bad for t in TARGETS)
        assert info.state.last_seq == total_bad  # one letter per bad message, none lost
        assert self.bus.health.problems() == {}
        assert all(m.task is not None and not m.task.done() for m in self.bus._monitors.values())
        return {t.name: (t.sent, t.bad) for t in TARGETS}

    def stop(self) -> None:
        if self.bus is not None:
            self.run(self.bus.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        if self.server is not None:
            self.server.stop()


def run_target(harness: Harness, target: Target, examples: int) -> None:
    """``examples`` generated messages on ``target``, one hypothesis run."""

    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(subject=target.subjects, data=garbage(target))
    def one(subject: str, data: bytes) -> None:
        harness.send(target, subject, data)

    one()


def fuzz(tmp: Path, examples_per_target: int) -> dict[str, tuple[int, int]]:
    for t in TARGETS:
        t.handled = t.sent = t.bad = 0
    harness = Harness(tmp)
    harness.start()
    try:
        for t in TARGETS:
            run_target(harness, t, examples_per_target)
        return harness.finish()
    finally:
        harness.stop()


def test_bus_fuzz_short(tmp_path: Path) -> None:
    counts = fuzz(tmp_path, 30)
    assert sum(sent for sent, _ in counts.values()) >= 30 * len(TARGETS)
    assert all(bad > 0 for _, bad in counts.values())  # garbage did reach every target


@pytest.mark.slow
def test_bus_fuzz_10k_per_subject(tmp_path: Path) -> None:
    t0 = time.monotonic()
    counts = fuzz(tmp_path, 10_000)
    print(f"\nbus fuzz: {time.monotonic() - t0:.0f} s")
    for name, (sent, bad) in counts.items():
        print(f"{name:16} sent {sent:6}  dead letters {bad:6}  handled {sent - bad:6}")
    assert all(sent >= 10_000 for sent, _ in counts.values())
