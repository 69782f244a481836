"""Chaos: kill -9 every kind of process in turn during a run; nothing is lost or run twice.

The stack is the real one (``libs.client.supervisor``, as ``mosaic up`` starts it) with a standby
placer, supervised the way ``mosaic up`` supervises it (``Stack.supervise`` every half second
restarts what died). A producer submits jobs throughout over HTTP, retrying with the same id
while the gateway is down (a repeat is one job). Faults, one after another: the active placer
(the standby takes over), the scorer, the gateway, the executor (its journal re-adopts its jobs),
the telemetry agent, and the NATS server; with three servers (``3-nats``, R3 streams) the one
leading the LIFECYCLE stream, which the supervisor restarts alone and which must rejoin. After
each, a probe job submitted right after the kill must start: the time from the kill to that start
is the fault's time to recovery, printed and returned for ``docs/benchmarks.md``. At the end the
independent lifecycle checker (``tests/e2e/checker.py``) reads the LIFECYCLE stream: no node is
ever over-booked, every job was submitted once and ended exactly once, and completed.

The short run (300 jobs, on one and on three NATS servers) is part of ``make test``; ``-m slow``
runs 2,000.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import msgspec
import nats
import pytest

from libs.bus.server import NatsCluster
from libs.client.api import ClientError, MosaicClient
from libs.client.demo import make_job
from libs.client.supervisor import SERVICES, Stack, StackError, start_stack
from libs.policy.inventory import demo_cluster
from proto import subjects
from proto.jobs import JobSpec
from proto.views import TERMINAL_STATES
from tests.e2e.checker import check, read_stream
from tests.e2e.conftest import E2E_CLOCK_FACTOR, require_services

# recovery within a wall-clock budget: run alone (make test's serial phase)
pytestmark = pytest.mark.serial

FAULTS = ("placer", "scorer", "gateway", "executor", "telemetry", "nats")
RECOVERY_TIMEOUT_S = 90.0


class Supervisor(threading.Thread):
    """``mosaic up``'s loop in a thread: one ``supervise()`` round every half second."""

    def __init__(self, stack: Stack) -> None:
        super().__init__(daemon=True, name="supervise")
        self.stack = stack
        self.lines: list[str] = []
        self.error: str | None = None
        self.halt = threading.Event()
        self.lock = threading.Lock()  # a kill and a restart round never interleave

    def run(self) -> None:
        while not self.halt.wait(0.5):
            try:
                with self.lock:
                    self.lines += self.stack.supervise()
            except StackError as exc:
                self.error = str(exc)
                return


def submit_retrying(client: MosaicClient, spec: JobSpec, timeout_s: float = 120.0) -> None:
    """Submit until the gateway takes it: a 503 or a refused connection while something is
    down is retried with the same id (idempotent); any 4xx is a test failure."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.submit(spec)
            return
        except ClientError as exc:
            if exc.status and 400 <= exc.status < 500 and exc.status != 408:
                raise
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"could not submit {spec.id} within {timeout_s:.0f} s")
        time.sleep(0.2)


def state_of(client: MosaicClient, job_id: str) -> str | None:
    try:
        return client.job(job_id).state
    except (ClientError, OSError):
        return None


def wait_started(client: MosaicClient, job_id: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while state_of(client, job_id) not in {"running", *TERMINAL_STATES}:
        if time.monotonic() > deadline:
            pytest.fail(f"{job_id} did not start within {timeout_s:.0f} s")
        time.sleep(0.1)


def wait_healthy(monitor_port: int, timeout_s: float) -> None:
    """A member's ``/healthz`` answers 200 once its JetStream assets are current."""
    deadline = time.monotonic() + timeout_s
    url = f"http://127.0.0.1:{monitor_port}/healthz"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"NATS member on monitor port {monitor_port} not healthy")
        time.sleep(0.2)


def stuck(client: MosaicClient, ids: list[str]) -> str:
    """Each stuck job's state, node and lifecycle, for the failure message: a job that never
    ends is a bug to find, and the stack's logs are gone with the test's temporary folder."""
    lines = []
    for job_id in ids:
        try:
            view = client.job(job_id)
            events = client.get_json(f"/v1/jobs/{job_id}/events")["events"]
            kinds = [f"{e.get('type')}@{e.get('node')}#{e.get('attempt', '')}" for e in events]
            lines.append(f"{job_id} {view.state} on {view.node}: {' '.join(kinds)}")
        except (ClientError, OSError) as exc:
            lines.append(f"{job_id}: {exc}")
    return "; ".join(lines)


def short_job(rng: random.Random, i: int, now: float) -> JobSpec:
    """A demo job of 2-10 minutes (0.2-1 wall s at the e2e clock), made when it is submitted
    (its deadline is absolute on the Mosaic clock, which runs 600x)."""
    return msgspec.structs.replace(
        make_job(rng, f"chaos-{i:05d}", now), est_runtime_s=rng.uniform(120, 600)
    )


@pytest.fixture
def chaos_stack(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Stack, Supervisor]]:
    """The supervised stack; ``request.param`` (indirect) is the number of NATS servers: 3 runs
    a JetStream cluster with R3 streams (``MOSAIC_STREAM_REPLICAS=3``, set by ``start_stack``),
    as ``mosaic up --nats-cluster 3`` does."""
    require_services()
    stack = start_stack(
        demo_cluster(),
        clock_factor=E2E_CLOCK_FACTOR,
        data_dir=tmp_path / "stack",
        metrics=True,  # /healthz: the supervisor also restarts a child that is alive but stuck
        services=(*SERVICES, "placer@standby"),
        nats_cluster=getattr(request, "param", 1),
    )
    sup = Supervisor(stack)
    sup.start()
    try:
        yield stack, sup
    finally:
        sup.halt.set()
        sup.join(timeout=10)
        stack.stop()


async def _lifecycle_leader(stack: Stack) -> str:
    """The server leading the LIFECYCLE stream (every job event goes through it)."""
    nc = await nats.connect(stack.nats_url.split(","))
    try:
        info = await nc.jetstream().stream_info(subjects.STREAM_LIFECYCLE)
    finally:
        await nc.close()
    assert info.cluster and info.cluster.leader, info.cluster
    return info.cluster.leader


def kill(stack: Stack, sup: Supervisor, fault: str) -> None:
    """SIGKILL the process ``fault`` names. ``nats`` on a cluster: the member leading the
    LIFECYCLE stream, the worst one to lose (its stream must elect a new leader)."""
    with sup.lock:
        if fault == "nats" and isinstance(stack.nats, NatsCluster):
            leader = asyncio.run(_lifecycle_leader(stack))
            stack.nats.kill(stack.nats.index_of(leader))
        elif fault == "nats":
            stack.nats.process.kill()
            stack.nats.process.wait(timeout=10)
        else:
            stack.kill(fault)


def run_chaos(stack: Stack, sup: Supervisor, n_jobs: int) -> dict[str, float]:
    """Submit ``n_jobs`` with every fault of ``FAULTS`` spread through the run; return each
    fault's time to recovery (s) after checking the whole lifecycle."""
    client = stack.client()
    rng = random.Random(n_jobs)
    every = max(1, n_jobs // (len(FAULTS) + 1))
    recovery_s: dict[str, float] = {}
    probes: list[str] = []
    ids: set[str] = set()
    for i in range(n_jobs):
        spec = short_job(rng, i, stack.clock.now())
        submit_retrying(client, spec)
        ids.add(spec.id)
        fault_no = (i + 1) // every - 1
        if (i + 1) % every == 0 and 0 <= fault_no < len(FAULTS):
            fault = FAULTS[fault_no]
            killed_at = time.monotonic()
            kill(stack, sup, fault)
            probe = JobSpec(id=f"probe-{fault}", gpus=1, gpu_mem_gb=8, est_runtime_s=60)
            submit_retrying(client, probe)
            wait_started(client, probe.id, RECOVERY_TIMEOUT_S)
            recovery_s[fault] = round(time.monotonic() - killed_at, 2)
            probes.append(probe.id)
            assert sup.error is None, sup.error
    ids |= set(probes)
    deadline = time.monotonic() + 300
    while True:
        states = {j.id: j.state for j in client.jobs()}
        left = [i for i in ids if states.get(i) not in TERMINAL_STATES]
        if not left:
            break
        assert sup.error is None, sup.error
        if time.monotonic() > deadline:
            pytest.fail(f"{len(left)} jobs never ended: {stuck(client, sorted(left)[:5])}")
        time.sleep(0.5)

    report = check(asyncio.run(read_stream(stack.nats_url)), stack.nodes)
    assert report.violations == [], "\n".join(report.violations[:20])
    for jid in ids:
        assert report.submitted[jid] == 1, jid
        assert len(report.terminal[jid]) == 1, (jid, report.terminal[jid])
        attempts = [a for _, a in report.placed[jid]]
        assert len(attempts) == len(set(attempts)), f"{jid} placed twice: {report.placed[jid]}"
    not_completed = {i: states[i] for i in ids if states[i] != "completed"}
    assert not not_completed, not_completed
    restarted = {line.split()[1] for line in sup.lines}
    assert set(FAULTS) <= restarted, sup.lines  # the supervisor brought every one back
    if isinstance(stack.nats, NatsCluster):  # ... and the killed member rejoined, current
        for server in stack.nats.servers:
            wait_healthy(server.monitor_port or 0, timeout_s=30)
    print(f"chaos {n_jobs} jobs: time to recovery (s) {recovery_s}; restarts {sup.lines}")
    return recovery_s


# the three-server variant is a soak (about 40 s on 2 cores): `make test-all`; the one-server
# variant keeps every fault of the schedule in `make test`
@pytest.mark.parametrize(
    "chaos_stack",
    [1, pytest.param(3, marks=pytest.mark.slow)],
    ids=["1-nats", "3-nats"],
    indirect=True,
)
def test_chaos_short(chaos_stack: tuple[Stack, Supervisor]) -> None:
    stack, sup = chaos_stack
    recovery = run_chaos(stack, sup, 300)
    assert set(recovery) == set(FAULTS)


@pytest.mark.slow
@pytest.mark.parametrize("chaos_stack", [1, 3], ids=["1-nats", "3-nats"], indirect=True)
def test_chaos_2000_jobs(chaos_stack: tuple[Stack, Supervisor]) -> None:
    stack, sup = chaos_stack
    recovery = run_chaos(stack, sup, 2000)
    assert set(recovery) == set(FAULTS)
