"""The checkpoint signal: the executor's request to save and exit.

Why the handler only raises a flag by default: a signal arrives between any two bytecodes,
possibly in the middle of an optimizer step; a checkpoint saved there holds half-updated
state. So the request is served at the next step boundary (``Runtime.step``), a point where the
job's state is consistent. A job whose steps are longer than its grace (``checkpoint_grace_s``)
asks for ``immediate`` saving instead: the save then runs inside the handler.

A second signal while a request is pending is ignored: a restarted executor may send it again.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

DEFAULT_SIGNAL = "SIGUSR1"


def signal_number(name: str) -> int:
    """``"SIGUSR2"`` (or ``"USR2"``) as its number; ValueError naming the signal otherwise."""
    full = name if name.startswith("SIG") else f"SIG{name}"
    number = getattr(signal, full, None)
    if not isinstance(number, int) or full in ("SIGKILL", "SIGSTOP"):
        raise ValueError(f"checkpoint signal: {name!r} is not a signal a process can catch")
    return int(number)


class CheckpointSignal:
    """Installs a handler for ``name``; ``requested`` turns True when it arrives, and
    ``on_request`` (if given) is called from the handler (the immediate mode)."""

    def __init__(self, name: str, on_request: Callable[[], None] | None = None) -> None:
        self.name = name
        self.number = signal_number(name)
        self.on_request = on_request
        self.requested = False
        self.requested_at: float | None = None  # time.monotonic() of the first signal
        self._previous: Any = None

    def install(self) -> None:
        """Must be called from the main thread (Python delivers signals there only)."""
        self._previous = signal.signal(self.number, self._handle)

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(self.number, self._previous)
            self._previous = None

    def _handle(self, _signum: int, _frame: FrameType | None) -> None:
        if self.requested:
            return
        self.requested = True
        self.requested_at = time.monotonic()
        if self.on_request is not None:
            self.on_request()
