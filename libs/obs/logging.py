"""structlog set-up shared by every service.

JSON lines when stdout is not a terminal (a container, ``mosaic up`` capturing output) or when
``MOSAIC_LOG_FORMAT=json``; coloured console lines otherwise. Every line carries the service
name, so interleaved logs of a local deployment stay readable.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import structlog

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


def log_format(explicit: str | None = None) -> str:
    """``json`` or ``console``: the flag, else ``MOSAIC_LOG_FORMAT``, else by whether stdout is a
    terminal."""
    fmt = (explicit or os.environ.get("MOSAIC_LOG_FORMAT") or "").strip().lower()
    if not fmt:
        return "console" if sys.stdout.isatty() else "json"
    if fmt not in ("json", "console"):
        raise ValueError(f"log format must be 'json' or 'console', got {fmt!r}")
    return fmt


def setup_logging(service: str, fmt: str | None = None, level: str = "info") -> Any:
    """Configure structlog (and the stdlib root logger, which nats-py logs to) once per process;
    return a logger bound to ``service``."""
    lvl = _LEVELS.get(level.lower())
    if lvl is None:
        raise ValueError(f"log level must be one of {sorted(_LEVELS)}, got {level!r}")
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
    ]
    if log_format(fmt) == "json":
        processors.append(structlog.processors.JSONRenderer())
    else:
        processors.append(structlog.dev.ConsoleRenderer())
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=_StdoutLogger,
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=max(lvl, logging.WARNING), stream=sys.stderr)
    return structlog.get_logger().bind(service=service)


class _StdoutLogger:
    """Writes each line to the ``sys.stdout`` of the moment, not the one at set-up: a stream
    replaced since (a test's capture, closed after it) must not make every later log line
    raise "I/O operation on closed file" inside a service's loop."""

    def __init__(self, *_args: Any) -> None:
        pass

    def msg(self, message: str) -> None:
        out = sys.stdout
        out.write(message + "\n")
        out.flush()

    log = debug = info = warn = warning = error = err = critical = fatal = exception = msg


def get_logger(**bind: Any) -> Any:
    """A structlog logger with ``bind`` context (works before set-up too, with defaults)."""
    return structlog.get_logger().bind(**bind)
