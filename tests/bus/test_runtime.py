"""The service shell: a real service process exits 0 on SIGTERM, non-zero without NATS."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from libs.bus.server import free_port

ROOT = Path(__file__).resolve().parents[2]
NODE = (
    '{"id": "t4-0", "gpu_model": "t4", "gpu_count": 2, "gpu_mem_gb": 16, "host_mem_gb": 64,'
    ' "cpus": 8, "idle_power_w": 10, "max_power_w": 70}'
)


def _spawn(nats_url: str) -> subprocess.Popen[str]:
    env = {**os.environ, "MOSAIC_NATS_URL": nats_url, "MOSAIC_LOG_FORMAT": "json"}
    return subprocess.Popen(
        [sys.executable, "-m", "services.executor", "--mode", "sim", "--node-spec", NODE],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_sigterm_drains_and_exits_zero(nats_url: str) -> None:
    proc = _spawn(nats_url)
    try:
        deadline = time.monotonic() + 30
        events: list[str] = []
        assert proc.stdout is not None
        while "executor_ready" not in events:
            assert time.monotonic() < deadline, f"not ready; saw {events}"
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("{"):
                record = json.loads(line)
                assert record["service"] == "executor"
                events.append(record["event"])
        assert "service_started" in events and "executor_ready" in events
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, rest
        assert "service_stopped" in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_unreachable_nats_exits_nonzero_naming_the_url() -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    env = {**os.environ, "MOSAIC_NATS_URL": url, "MOSAIC_LOG_FORMAT": "json"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.executor",
            "--mode",
            "sim",
            "--node-spec",
            NODE,
            "--connect-attempts",
            "1",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3
    assert "bus_unavailable" in proc.stdout and url in proc.stdout
