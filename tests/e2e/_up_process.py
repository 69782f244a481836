"""``mosaic up`` as a child process whose output a test waits on, line by line.

Why a helper: tests of the supervisor drive the real command (``python -m libs.client.cli
up``), wait for what it prints, signal it and check it stopped cleanly; each did that with its
own reader thread and polling loop.
"""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.e2e.conftest import ROOT


class UpProcess:
    """``mosaic up --no-live ARGS`` started now; ``output`` holds the lines read so far."""

    def __init__(self, *args: str) -> None:
        cmd = [sys.executable, "-m", "libs.client.cli", "up", "--no-live", *args]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._lines: queue.Queue[str] = queue.Queue()
        stdout = self.proc.stdout
        threading.Thread(
            target=lambda: [self._lines.put(x) for x in stdout or []], daemon=True
        ).start()
        self.output: list[str] = []

    def text(self) -> str:
        return "".join(self.output)

    def wait_for(self, text: str, timeout_s: float) -> None:
        """Until a line containing ``text`` is printed; fails if the process ends first."""
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.output):
            assert time.monotonic() < deadline and self.proc.poll() is None, self.text()
            with contextlib.suppress(queue.Empty):
                self.output.append(self._lines.get(timeout=1))

    def interrupt(self, timeout_s: float = 60) -> int:
        """Ctrl-C, as in a terminal; the exit code."""
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=timeout_s)

    def kill_if_running(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def stack_state(data_dir: Path) -> dict:
    """``stack.json`` of the ``mosaic up`` running on ``data_dir``."""
    return json.loads((data_dir / "stack.json").read_text())
