"""Service fuzzing (issue 12): the real placer, scorer, gateway, a sim executor and a sim
telemetry agent for a two-node cluster, in-process through the real ``serve`` shell on one real
nats-server, fed hypothesis-generated messages on every subject and KV bucket they consume.

The bus fuzzer (test_bus_fuzz.py) proves that what does not decode is a dead letter. Here the
messages mostly *do* decode: real ``proto`` Structs with hostile values (tests/fuzz/
service_inputs.py), which only the services' own handlers can refuse. After each target's batch:

- every service's health is ok (no receive loop died or wedged, the placer holds its lease);
- no handler raised (``mosaic_handler_errors_total``, handler dead letters) and no round of a
  service loop failed (``cycle_failed``, ``score_failed``, ... logged at error level);
- hostile input was noticed: records refused (``mosaic_bus_records_refused_total``), dead
  letters, or - for an unsound ``Submitted`` - the placer's ``Failed``;
- the gateway answers every read below 500, and a valid job submitted over HTTP completes.

At the end the independent checker (tests/e2e/checker.py) replays LIFECYCLE, less the events
the fuzzer forged itself (its ``Submitted`` stay: those are submissions), and finds no
over-booking of the real cluster. ``make test`` sends a few hundred messages; the ``slow`` run
10,000 per target (docs/benchmarks.md, "Fuzzing (services)").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from prometheus_client import REGISTRY

from libs.bus import Bus, ServiceConfig, serve
from libs.bus.runtime import ServiceContext
from libs.bus.server import NatsServer, free_port, start_nats_server
from libs.clock import Clock
from proto import subjects
from proto.events import Submitted
from proto.jobs import CancelRequest
from proto.validation import sound_id
from services.defrag.service import main as defrag_main
from services.executor.service import main as executor_main
from services.gateway.service import ReadModelConfig
from services.gateway.service import main as gateway_main
from services.placer.service import main as placer_main
from services.profiler.service import main as profiler_main
from services.scorer.service import main as scorer_main
from services.telemetry.service import main as telemetry_main
from services.thermal.service import main as thermal_main
from tests.e2e.checker import check, read_stream
from tests.fuzz import service_inputs as inp
from tests.fuzz.service_targets import TARGETS, Target
from tests.services.test_placer import small_cluster

R = TypeVar("R")
FACTOR = 60.0  # Mosaic seconds per wall second: a sound two-minute job ends in two seconds
NODES = small_cluster()
NODE_JSON = msgspec.json.encode(NODES).decode()
SERVICES = (
    "placer", "scorer", "gateway", "executor", "telemetry", "thermal", "profiler", "defrag",
)  # fmt: skip


class CountingLog:
    """A service's logger that counts what it logs at error level (``cycle_failed``, ...)."""

    def __init__(self, inner: Any, errors: Counter[str]) -> None:
        self._inner, self._errors = inner, errors

    def bind(self, **kw: Any) -> CountingLog:
        return CountingLog(self._inner.bind(**kw), self._errors)

    def error(self, event: str, *a: Any, **kw: Any) -> Any:
        self._errors[event] += 1
        return self._inner.error(event, *a, **kw)

    def exception(self, event: str, *a: Any, **kw: Any) -> Any:
        self._errors[event] += 1
        return self._inner.exception(event, *a, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _sum(name: str, label: str = "subject", values: tuple[str, ...] = ()) -> float:
    """Sum of a counter over every service of the stack (and ``label`` in ``values``)."""
    total = 0.0
    for metric in REGISTRY.collect():
        for s in metric.samples:
            ours = s.name == name and s.labels.get("service") in SERVICES
            if ours and (not values or s.labels.get(label) in values):
                total += s.value
    return total


@dataclass
class Stack:
    """The services and a forger's Bus, on an event loop in a thread of its own, so hypothesis
    (synchronous) drives them one example at a time."""

    store: Path
    server: NatsServer | None = None
    bus: Bus | None = None
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    contexts: dict[str, ServiceContext] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    tasks: dict[str, asyncio.Task[int]] = field(default_factory=dict)
    stop: asyncio.Event | None = None
    forged: set[tuple[str, bytes]] = field(default_factory=set)  # all but Submitted
    stats: dict[str, Counter[str]] = field(default_factory=dict)  # per target, see run_target
    port: int = 0
    clock: Clock = field(default_factory=lambda: Clock(epoch=time.time(), factor=FACTOR))
    probes: int = 0

    def run(self, coro: Coroutine[Any, Any, R], timeout_s: float = 120.0) -> R:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def start(self) -> None:
        threading.Thread(target=self.loop.run_forever, name="fuzz-stack", daemon=True).start()
        self.server = start_nats_server(self.store)
        self.run(self._start())

    async def _start(self) -> None:
        assert self.server is not None
        url = self.server.url
        self.bus = await Bus.connect(url, "fuzzer")
        await self.bus.ensure_topology()
        self.stop = asyncio.Event()
        self.port = free_port()
        clock = self.clock
        nodes = [NODE_JSON]
        flags: dict[str, dict[str, Any]] = {
            "telemetry": {"backend": "sim", "node_spec": nodes, "interval_s": 0.5, "seed": 0},
            "executor": {"mode": "sim", "node_spec": nodes, "report_interval": 0.5},
            "scorer": {"rescore_s": 0.5, "debounce_s": 0.05},
            "placer": {"tick_s": 0.5, "debounce_s": 0.02, "settle_s": 0.2, "lease_ttl_s": 2.0},
            "gateway": {
                "http_host": "127.0.0.1",
                "http_port": self.port,
                "insecure_no_auth": True,
                "read_models": ReadModelConfig(snapshots=False),
            },
            "thermal": {},  # the guard's defaults (ThermalConfig)
            "profiler": {},  # the learning rule's defaults (LearningConfig)
            "defrag": {"interval_s": 0.5},
        }
        mains = {
            "telemetry": telemetry_main,
            "executor": executor_main,
            "scorer": scorer_main,
            "placer": placer_main,
            "gateway": gateway_main,
            "thermal": thermal_main,
            "profiler": profiler_main,
            "defrag": defrag_main,
        }
        cfg = ServiceConfig(nats_url=url, log_format="json", log_level="error")
        for name, real in mains.items():
            args = argparse.Namespace(hot=[], **flags[name])
            task = serve(
                name,
                self._capture(name, real),
                cfg,
                args=args,
                stop=self.stop,
                install_signals=False,
                clock=clock,
            )
            self.tasks[name] = asyncio.create_task(task)
        await self._until(lambda: len(self.contexts) == len(mains), "services started")
        await self._until(self._gateway_up, "gateway serving", 30.0)

    def _capture(self, name: str, real: Callable[[ServiceContext], Awaitable[None]]) -> Any:
        async def main(ctx: ServiceContext) -> None:
            ctx.log = CountingLog(ctx.log, self.errors)
            self.contexts[name] = ctx
            await real(ctx)

        return main

    async def _until(self, check: Callable[[], Any], what: str, timeout_s: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = check()
            got = await got if asyncio.iscoroutine(got) else got
            if got:
                return got
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for: {what}")

    async def _gateway_up(self) -> bool:
        url = f"http://127.0.0.1:{self.port}/healthz"
        with contextlib.suppress(aiohttp.ClientError):
            async with aiohttp.ClientSession() as http, http.get(url) as r:
                return r.status == 200
        return False

    # --- sending ---------------------------------------------------------------------------
    async def lifecycle(self, item: Any) -> None:
        assert self.bus is not None
        if isinstance(item, bytes):
            subject, data = subjects.lifecycle("fz-garbage"), item
            self.forged.add((subject, data))  # the checker is no decoder to fuzz
        else:
            job = item.job_id if sound_id(item.job_id) else "fz-bad"
            subject, data = subjects.lifecycle(job), inp.encode(item)
            if not isinstance(item, Submitted):
                self.forged.add((subject, data))
        await self.bus.js.publish(subject, data)

    async def durable(self, subject: str, item: Any) -> None:
        assert self.bus is not None
        data = item if isinstance(item, bytes) else inp.encode(item)
        await self.bus.js.publish(subject, data)

    async def core(self, subject: str, item: Any) -> None:
        assert self.bus is not None
        data = item if isinstance(item, bytes) else inp.encode(item)
        if len(data) < self.bus.max_publish_bytes():
            await self.bus.nc.publish(subject, data)

    async def kv(self, bucket: str, key: str, item: Any) -> None:
        assert self.bus is not None
        data = item if isinstance(item, bytes) else inp.encode(item)
        kv = await self.bus.js.key_value(bucket)
        await kv.put(key, data)

    # --- checks ----------------------------------------------------------------------------
    async def settle(self) -> None:
        """Until every JetStream consumer of the stack has nothing pending, then a moment for
        the core subscriptions and KV watches."""
        assert self.bus is not None
        await self.bus.nc.flush()
        for ctx in self.contexts.values():
            for c in list(ctx.bus._consumers):

                async def idle(c: Any = c) -> bool:
                    info = await c.sub.consumer_info()
                    return info.num_pending == 0 and info.num_ack_pending == 0

                await self._until(idle, f"{ctx.name} consumer {c.subject} drained", 120.0)
        await asyncio.sleep(1.0)

    async def cleanup(self) -> None:
        """What an operator would remove: the fuzzer's KV keys, and its jobs (cancelled)."""
        assert self.bus is not None
        for bucket, keys in (
            (subjects.KV_NODES, inp.FAKE_NODES),
            (subjects.KV_LEDGER, inp.OTHER_IDS + inp.KV_KEYS),
            (subjects.KV_TENANTS, inp.KV_KEYS),
        ):
            kv = await self.bus.js.key_value(bucket)
            for key in keys:
                with contextlib.suppress(Exception):
                    await kv.delete(key)
        for job in inp.SUBMIT_IDS:
            await self.bus.publish(subjects.SUBJECT_CANCEL, CancelRequest(job_id=job))

    async def probe(self, name: str) -> None:
        """The gateway answers every read below 500, and a valid job submitted over HTTP
        completes."""
        base = f"http://127.0.0.1:{self.port}"
        self.probes += 1
        job = f"probe-{self.probes}"
        async with aiohttp.ClientSession() as http:
            for path in ("/", "/v1/jobs", "/v1/nodes", "/v1/jobs/fz-s1", "/v1/jobs/fz-s1/events"):
                async with http.get(base + path) as r:
                    assert r.status < 500, (path, r.status, await r.text())

            async def fresh() -> bool:  # telemetry flows again, once the batch's backlog is read
                async with http.get(f"{base}/v1/nodes") as r:
                    seen = {n["spec"]["id"]: n["telemetry"] for n in (await r.json())["nodes"]}
                times = [(seen.get(n) or {}).get("time", 0.0) for n in inp.REAL_NODES]
                return all(abs(self.clock.now() - t) < 3 * FACTOR for t in times)

            await self._until(fresh, f"fresh telemetry after the {name} batch", 120.0)
            body = {"id": job, "gpus": 1, "est_runtime_s": 30.0}
            async with http.post(f"{base}/v1/jobs", json=body) as r:
                assert r.status == 201, await r.text()

            async def done() -> bool:
                async with http.get(f"{base}/v1/jobs/{job}") as r:
                    view = await r.json()
                assert view["state"] not in ("failed", "cancelled"), view
                return view["state"] == "completed"

            try:
                await self._until(done, f"{job} completed after the {name} batch", 60.0)
            except AssertionError as exc:
                raise AssertionError(f"{exc}; errors logged: {dict(self.errors)}") from None

    def check_ok(self, target: Target, before: dict[str, float]) -> None:
        name = target.name
        for svc, ctx in self.contexts.items():
            assert ctx.health.problems() == {}, (name, svc, ctx.health.problems())
            assert all(not m.task.done() for m in ctx.bus._monitors.values() if m.task), svc
            assert not self.tasks[svc].done(), (svc, self.tasks[svc])
        assert not self.errors, (name, dict(self.errors))
        now = counts()
        assert now["handler_errors"] == before["handler_errors"], name
        assert now["handler_dead"] == before["handler_dead"], name
        assert now["noticed"] > before["noticed"] or not target.noticed, f"{name}: unnoticed"

    def close(self) -> None:
        async def _close() -> None:
            assert self.stop is not None and self.bus is not None
            self.stop.set()
            for name, task in self.tasks.items():
                assert await asyncio.wait_for(task, 30) == 0, name
            await self.bus.close()

        try:
            self.run(_close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            if self.server is not None:
                self.server.stop()


def counts() -> dict[str, float]:
    """The stack's counters: bad input refused as a record, dead-lettered, or (an unsound job)
    failed by the placer; and handler failures, which must stay 0."""
    c = {
        "handler_errors": _sum("mosaic_handler_errors_total"),
        "handler_dead": _sum("mosaic_dead_letters_by_kind_total", "kind", ("handler",)),
        "refused": _sum("mosaic_bus_records_refused_total"),
        "dead letters": _sum("mosaic_dead_letters_total"),
        "jobs failed": _metric("mosaic_placer_refusals_total"),
        "intents refused": sum(
            s.value
            for m in REGISTRY.collect()
            for s in m.samples
            if s.name == "mosaic_placer_intents_total" and s.labels.get("verdict") == "refused"
        ),
    }
    c["noticed"] = c["refused"] + c["dead letters"] + c["jobs failed"] + c["intents refused"]
    return c


def run_target(stack: Stack, target: Target, examples: int) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(item=target.strategy)
    def one(item: Any) -> None:
        stats["sent"] += 1
        payload = item[-1] if isinstance(item, tuple) else item
        stats["raw garbage"] += isinstance(payload, bytes)
        stack.run(target.send(stack, item))

    stats = stack.stats.setdefault(target.name, Counter())

    before = counts()
    one()
    for item in inp.FIXED[target.name]:  # the cases issue 12 names, last: they stay in KV
        stats["sent"] += 1
        stack.run(target.send(stack, item))
    stack.run(stack.settle(), 600.0)
    stack.run(stack.probe(target.name))  # with the batch's records still in the buckets
    stack.check_ok(target, before)
    after = counts()  # by every consumer of the target (a lifecycle event reaches three)
    for k in ("refused", "dead letters", "jobs failed", "intents refused"):
        stats[k] = int(after[k] - before[k])
    stack.run(stack.cleanup())


def fuzz(tmp: Path, examples_per_target: int) -> dict[str, Counter[str]]:
    stack = Stack(tmp / "nats")
    stack.start()
    try:
        for t in TARGETS:
            run_target(stack, t, examples_per_target)
        assert stack.server is not None
        events = stack.run(read_stream(stack.server.url))
        report = check([e for e in events if e not in stack.forged], NODES)
        assert report.violations == [], report.violations[:10]
        probes = [j for j in report.submitted if j.startswith("probe-")]
        assert len(probes) == len(TARGETS)
        assert all(report.terminal[j] == ["completed"] for j in probes)
        return stack.stats
    finally:
        stack.close()


def test_service_fuzz_short(tmp_path: Path) -> None:
    stats = fuzz(tmp_path, 25)
    assert sum(c["sent"] for c in stats.values()) >= 25 * len(TARGETS)


@pytest.mark.slow
def test_service_fuzz_10k_per_target(tmp_path: Path) -> None:
    t0 = time.monotonic()
    stats = fuzz(tmp_path, 10_000)
    print(f"\nservice fuzz: {time.monotonic() - t0:.0f} s")
    for name, c in stats.items():
        print(f"{name:14}", "  ".join(f"{k} {v}" for k, v in c.items()))
    assert all(c["sent"] >= 10_000 for c in stats.values())
