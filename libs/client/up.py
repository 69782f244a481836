"""``mosaic up``: start the stack, optionally feed it demo jobs, show it, stop it cleanly.

Why asyncio here: three things happen at once (demo submissions, a view refreshed every
second, the audit stream of decisions) and a signal must interrupt all of them. Blocking HTTP
calls run in a worker thread; the stack's children are stopped in ``finally`` whatever
happened, and the summary is printed after they are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import msgspec
from rich.console import Console
from rich.live import Live

from libs.client.api import ClientError
from libs.client.demo import DemoGenerator
from libs.client.live import Snapshot, final_summary, render, summary_line
from libs.client.supervisor import Stack, StackError, start_stack
from proto import subjects
from proto.decisions import Decision
from proto.nodes import NodeSpec


@dataclass
class UpOptions:
    nodes: list[NodeSpec]
    data_dir: Path
    clock_factor: float = 60.0
    port: int = 8080
    demo: bool = False
    demo_rate_per_s: float = 1.0
    seed: int = 0
    duration_s: float | None = None
    live: bool = True
    summary_every_s: float = 5.0
    keep_state: bool = False
    metrics: bool = True
    nats_cluster: int = 1  # >1: a JetStream cluster of that many servers, streams with R=N
    policy_file: Path | None = None  # every service runs this policy.json (MOSAIC_POLICY_FILE)


def check_port_free(port: int) -> None:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise StackError(
                f"port {port} is already in use (another `mosaic up`?): pass --port"
            ) from None


def prepare_data_dir(data_dir: Path, keep_state: bool) -> None:
    """A fresh run starts from empty streams unless ``--keep-state``: old jobs would replay."""
    data_dir.mkdir(parents=True, exist_ok=True)
    if not keep_state:
        for sub in ("nats", "logs", "executor"):  # executor: its journal of running jobs
            shutil.rmtree(data_dir / sub, ignore_errors=True)


class _Decisions:
    """The last few placer decisions, read from the audit subjects (a viewer: never fatal)."""

    def __init__(self, keep: int = 6):
        self.last: deque[Decision] = deque(maxlen=keep)
        self.undecodable = 0
        self._nc = None

    async def start(self, nats_url: str) -> None:
        try:
            import nats

            self._nc = await nats.connect(nats_url, connect_timeout=2, max_reconnect_attempts=3)
            await self._nc.subscribe(f"{subjects.DECISIONS_PREFIX}.>", cb=self._on_msg)
        except Exception:
            self._nc = None  # the view works without decisions; the summary line says nothing

    async def _on_msg(self, msg) -> None:  # type: ignore[no-untyped-def]
        try:
            self.last.append(msgspec.json.decode(msg.data, type=Decision))
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.undecodable += 1

    async def close(self) -> None:
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()


def _snapshot(
    stack: Stack, started: float, demo: DemoGenerator | None, dec: _Decisions
) -> Snapshot:
    client = stack.client()
    problem = ""
    jobs, nodes = [], []
    try:
        jobs = client.jobs()
        nodes = client.nodes()
    except ClientError as exc:
        problem = exc.one_line()
    if stack.failure:
        problem = stack.failure
    elif dead := stack.dead():
        problem = "; ".join(f"{s.name} exited, restarting (see {s.log_path})" for s in dead)
    return Snapshot(
        jobs=jobs,
        nodes=nodes,
        elapsed_s=time.monotonic() - started,
        submitted_by_demo=demo.submitted if demo else 0,
        refused_by_demo=len(demo.refused) if demo else 0,
        decisions=list(reversed(dec.last)),
        problem=problem,
    )


async def run_up(opts: UpOptions, console: Console) -> int:
    """Run until a signal or ``duration_s``; returns the exit code (0 = clean stop)."""
    check_port_free(opts.port)
    prepare_data_dir(opts.data_dir, opts.keep_state)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    console.print(f"starting NATS and services for {len(opts.nodes)} nodes ...")
    try:
        stack = await _start(opts, stop)
    except StackError:
        if stop.is_set():
            console.print("interrupted while starting; everything started was stopped.")
            return 130
        raise
    dec = _Decisions()
    code = 0
    last = None
    try:
        console.print(f"gateway    {stack.gateway_url}  (dashboard: {stack.gateway_url}/)")
        console.print(f"nats       {stack.nats.url}")  # plain: stack.nats_url holds a password
        if stack.credentials is not None:
            where = stack.credentials.directory
            console.print(
                f"secrets    {where}  (admin.token, producer.json, a <user>.json per service)",
                highlight=False,
            )
        console.print(f"logs       {stack.logs_dir}")
        for name, url in stack.metrics_urls().items():
            console.print(f"metrics    {name:<10} {url}")
        console.print(
            f"clock      {opts.clock_factor:g}x (an hour of job time = "
            f"{3600 / opts.clock_factor:.0f} s)"
        )
        console.print(
            f"try        MOSAIC_GATEWAY={stack.gateway_url} mosaic queue", highlight=False
        )
        await dec.start(stack.nats_url)
        client = stack.client()
        demo = (
            DemoGenerator(
                client.submit,
                now=stack.clock.now,
                seed=opts.seed,
                rate_per_s=opts.demo_rate_per_s,
            )
            if opts.demo
            else None
        )
        started = time.monotonic()
        last = await _loop(opts, console, stack, demo, dec, stop, started)
        if stack.failure:
            console.print(f"error: {stack.failure}", style="red")
            code = 1
    finally:
        await dec.close()
        forced = await asyncio.to_thread(stack.stop)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    left = [f"{n}({pid})" for n, pid in stack.pids().items() if _pid_alive(pid)]
    console.print("stopped" + (f" (forced: {', '.join(forced)})" if forced else "") + ".")
    if left:
        console.print(f"error: processes left behind: {', '.join(left)}", style="red")
        code = 1
    if last is not None:
        console.print(final_summary(last), highlight=False)
    return code


async def _start(opts: UpOptions, stop: asyncio.Event) -> Stack:
    return await asyncio.to_thread(
        start_stack,
        opts.nodes,
        clock_factor=opts.clock_factor,
        data_dir=opts.data_dir,
        gateway_port=opts.port,
        metrics=opts.metrics,
        interrupted=stop.is_set,
        nats_cluster=opts.nats_cluster,
        extra_env=_policy_env(opts.policy_file),
    )


def _policy_env(policy_file: Path | None) -> dict[str, str]:
    """The services' environment naming the policy file (``libs.policy_io.policy_file``)."""
    from libs.policy_io.policy_file import ENV

    return {} if policy_file is None else {ENV: str(policy_file.resolve())}


async def _loop(
    opts: UpOptions,
    console: Console,
    stack: Stack,
    demo: DemoGenerator | None,
    dec: _Decisions,
    stop: asyncio.Event,
    started: float,
) -> Snapshot:
    header = f"Mosaic at {stack.gateway_url}: {len(opts.nodes)} nodes, clock {opts.clock_factor:g}x"
    live = Live(console=console, refresh_per_second=2, transient=False) if opts.live else None
    next_line = 0.0
    snap = Snapshot(jobs=[], nodes=[])
    with live if live is not None else contextlib.nullcontext():
        while not stop.is_set():
            elapsed = time.monotonic() - started
            if opts.duration_s is not None and elapsed >= opts.duration_s:
                break
            if demo is not None:
                await asyncio.to_thread(demo.step)
            snap = await asyncio.to_thread(_snapshot, stack, started, demo, dec)
            if live is not None:
                live.update(render(snap, header))
            elif elapsed >= next_line:
                console.print(summary_line(snap), highlight=False, soft_wrap=True)
                next_line = elapsed + opts.summary_every_s
            # a child that died or stays unhealthy is restarted (with backoff), and said so;
            # only one that keeps failing stops the stack
            try:
                for line in await asyncio.to_thread(stack.supervise):
                    console.print(line, style="yellow", highlight=False)
            except StackError:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)
    snap = await asyncio.to_thread(_snapshot, stack, started, demo, dec)
    if not opts.live:
        console.print(summary_line(snap), highlight=False, soft_wrap=True)
    return snap


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
