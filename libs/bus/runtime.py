"""The shell every service's ``__main__`` runs in: config → obs → bus → topology → main → drain.

Why shared: every service must read the same variables (``docs/runtime-contract.md``), connect
the same way, and stop the same way on SIGTERM (drain, exit 0), or ``mosaic up`` and Kubernetes
would each need per-service special cases.

Usage in ``services/<name>/__main__.py``::

    parser = common_arg_parser("executor")
    parser.add_argument("--mode", choices=["sim", "local"], required=True)
    run_service("executor", main, parser=parser)   # main(ctx) reads ctx.args.mode

``main(ctx)`` sets up its handlers and returns when ``ctx.stop`` is set (``await
ctx.stop.wait()``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from opentelemetry import trace

from libs.bus.auth import load_connect_options
from libs.bus.connection import Bus
from libs.bus.errors import BusUnavailable
from libs.bus.steps import follow_steps
from libs.clock import Clock
from libs.obs.health import Health
from libs.obs.logging import setup_logging
from libs.obs.metrics import UP, start_metrics_server
from libs.obs.tracing import setup_tracing, shutdown_tracing

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


@dataclass(frozen=True)
class ServiceConfig:
    """The flags and variables every service shares."""

    nats_url: str = DEFAULT_NATS_URL
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    log_format: str | None = None
    log_level: str = "info"
    otlp_endpoint: str | None = None
    connect_attempts: int = 20
    nats_creds: str | None = None  # a JSON of nats.connect keyword arguments (libs.bus.auth)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServiceConfig:
        return cls(
            nats_url=args.nats_url,
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host,
            log_format=args.log_format,
            log_level=args.log_level,
            otlp_endpoint=args.otlp_endpoint or None,
            connect_attempts=args.connect_attempts,
            nats_creds=getattr(args, "nats_creds", None) or None,
        )


@dataclass
class ServiceContext:
    """What ``main(ctx)`` gets: the connection, the shared clock, logging, tracing, the stop
    signal, the common config and every parsed flag (``args``, including the service's own)."""

    name: str
    bus: Bus
    clock: Clock
    log: Any
    tracer: trace.Tracer
    stop: asyncio.Event
    config: ServiceConfig
    args: argparse.Namespace = field(default_factory=argparse.Namespace)
    health: Health = field(default_factory=lambda: Health("service"))


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"{name} must be an integer, got {raw!r}") from None


def env_float(name: str, default: str) -> float:
    """A service flag's default from the environment; a non-number stops the service at once."""
    raw = os.environ.get(name, default)
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"{name} must be a number, got {raw!r}") from None


def common_arg_parser(name: str) -> argparse.ArgumentParser:
    """A parser with the shared flags; defaults come from the environment variables."""
    p = argparse.ArgumentParser(prog=f"python -m services.{name}", description=f"Mosaic {name}")
    p.add_argument(
        "--nats-url",
        default=os.environ.get("MOSAIC_NATS_URL", DEFAULT_NATS_URL),
        help="NATS server (env MOSAIC_NATS_URL)",
    )
    p.add_argument(
        "--nats-creds",
        default=os.environ.get("MOSAIC_NATS_CREDS") or None,
        help="JSON file of this service's NATS credentials: user, password, inbox prefix, TLS "
        "files (env MOSAIC_NATS_CREDS; unset = connect without a user)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=_env_int("MOSAIC_METRICS_PORT", 0),
        help="Prometheus /metrics port, 0 = off (env MOSAIC_METRICS_PORT)",
    )
    p.add_argument(
        "--metrics-host",
        default=os.environ.get("MOSAIC_METRICS_HOST", "127.0.0.1"),
        help="address /metrics and /healthz bind to (env MOSAIC_METRICS_HOST); "
        "loopback unless an operator opens it",
    )
    p.add_argument(
        "--log-format",
        choices=["json", "console"],
        default=os.environ.get("MOSAIC_LOG_FORMAT") or None,
        help="json or console (env MOSAIC_LOG_FORMAT; default json unless stdout is a tty)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--otlp-endpoint",
        default=os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None,
        help="OTLP/HTTP endpoint for spans (env OTEL_EXPORTER_OTLP_ENDPOINT); unset = no export",
    )
    p.add_argument(
        "--connect-attempts",
        type=int,
        default=20,
        help="connection attempts to NATS at start before giving up",
    )
    return p


async def serve(
    name: str,
    main: Callable[[ServiceContext], Awaitable[None]],
    config: ServiceConfig,
    *,
    args: argparse.Namespace | None = None,
    stop: asyncio.Event | None = None,
    install_signals: bool = True,
    clock: Clock | None = None,
) -> int:
    """Run one service until ``main`` returns or ``stop`` is set; return the exit code.

    Tests call this in-process with their own ``stop`` event and ``install_signals=False``.
    """
    log = setup_logging(name, config.log_format, config.log_level)
    tracer = setup_tracing(name, config.otlp_endpoint or "")
    health = Health(name)
    if config.metrics_port:
        try:
            start_metrics_server(config.metrics_port, config.metrics_host, health)
        except OSError as exc:
            log.error("metrics_port_unavailable", port=config.metrics_port, error=str(exc))
            return 2
        log.info("metrics", port=config.metrics_port, host=config.metrics_host)
    stop = stop or asyncio.Event()
    if install_signals:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    try:
        creds = load_connect_options(config.nats_creds) if config.nats_creds else {}
    except ValueError as exc:
        log.error("nats_credentials_unreadable", error=str(exc))
        return 2
    try:
        bus = await Bus.connect(config.nats_url, name, attempts=config.connect_attempts, **creds)
    except BusUnavailable as exc:
        log.error("bus_unavailable", error=str(exc))
        return 3
    code = 0
    try:
        await bus.ensure_topology()
        UP.labels(name).set(1)
        ctx = ServiceContext(
            name=name,
            bus=bus,
            clock=clock or Clock.from_env(),
            log=log,
            tracer=tracer,
            stop=stop,
            config=config,
            args=args or argparse.Namespace(),
            health=health,
        )
        health.register("nats", bus._connection_problem)
        bus.health = health
        await follow_steps(bus, ctx.clock)  # stepped mode only: the clock follows clock.step
        log.info("service_started", nats_url=config.nats_url)
        main_task = asyncio.create_task(main(ctx), name=f"{name}:main")
        stop_task = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({main_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        if main_task in done:
            exc = main_task.exception()
            if exc is not None:
                log.error("service_failed", error=repr(exc), exc_info=exc)
                code = 1
        else:
            # give main a moment to finish its own clean-up after seeing ctx.stop
            try:
                await asyncio.wait_for(main_task, timeout=10.0)
            except (TimeoutError, asyncio.CancelledError):
                main_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await main_task
            except Exception as exc:
                log.error("service_failed", error=repr(exc), exc_info=exc)
                code = 1
        stop_task.cancel()
    finally:
        UP.labels(name).set(0)
        await bus.close()
        _flush_spans()
        log.info("service_stopped", code=code)
    return code


def _flush_spans() -> None:
    """Flush spans; in a process that hosts one service this is at exit."""
    with contextlib.suppress(Exception):
        from opentelemetry.sdk.trace import TracerProvider

        provider = trace.get_tracer_provider()
        if isinstance(provider, TracerProvider):
            provider.force_flush(timeout_millis=5000)


def run_service(
    name: str,
    main: Callable[[ServiceContext], Awaitable[None]],
    *,
    parser: argparse.ArgumentParser | None = None,
    argv: Sequence[str] | None = None,
    validate: Callable[[argparse.Namespace], None] | None = None,
) -> NoReturn:
    """Parse flags, run the service, and exit with its code (0 after a clean SIGTERM/SIGINT).

    ``validate(args)`` may raise ``ValueError`` for a bad flag: the message is printed and the
    process exits 2 before connecting to anything.
    """
    parser = parser or common_arg_parser(name)
    args = parser.parse_args(argv)
    if validate is not None:
        try:
            validate(args)
        except ValueError as exc:
            parser.error(str(exc))
    config = ServiceConfig.from_args(args)
    code = asyncio.run(serve(name, main, config, args=args))
    shutdown_tracing()
    sys.exit(code)
