"""``mosaic up --demo`` as an operator runs it: a subprocess, jobs flow, Ctrl-C stops it all."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from libs.bus.server import free_port
from libs.policy.inventory import seed_cluster, total_gpus
from tests.e2e.conftest import require_services

ROOT = Path(__file__).resolve().parents[2]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def test_mosaic_up_demo_flows_jobs_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    require_services()
    port = free_port()
    args = [sys.executable, "-m", "libs.client.cli", "up", "--demo", "--no-live", "--rate", "2",
            "--clock-factor", "300", "--duration", "40", "--port", str(port),
            "--data-dir", str(tmp_path)]  # fmt: skip
    proc = subprocess.Popen(
        args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: queue.Queue[str] = queue.Queue()
    output: list[str] = []
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    completed = 0
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            output.append(line)
            m = re.search(r"completed=(\d+)", line)
            if m and int(m.group(1)) > 0:
                completed = int(m.group(1))
                break
        assert completed > 0, "no job completed; output:\n" + "".join(output)
        state = json.loads((tmp_path / "stack.json").read_text())
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    time.sleep(0.5)
    while not lines.empty():
        output.append(lines.get())
    text = "".join(output)
    assert code == 0, text
    assert "summary:" in text and "Traceback" not in text
    left = {name: pid for name, pid in state["pids"].items() if _alive(pid)}
    assert not left, f"processes left behind: {left}"
    nats_port = int(state["nats_url"].rsplit(":", 1)[1])
    assert not _port_open(nats_port) and not _port_open(port)


# soak-length: make test-all; `mosaic up` and its clean stop stay covered by the ctrl-c test above
@pytest.mark.slow
def test_mosaic_up_stops_by_itself_after_duration(tmp_path: Path) -> None:
    """--nodes 3 (the seed mix, scaled) and --duration: exit 0 with a summary, nothing left."""
    require_services()
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "libs.client.cli", "up", "--no-live", "--nodes", "3",
         "--duration", "2", "--port", str(port), "--data-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"http://127.0.0.1:{port}" in proc.stdout and "summary:" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    state = json.loads((tmp_path / "stack.json").read_text())
    assert not [pid for pid in state["pids"].values() if _alive(pid)]
    gpus = total_gpus(seed_cluster(round(3 * 6.8)))  # the seed mix averages 6.8 GPUs a node
    assert f"gpus_busy=0/{gpus} " in proc.stdout  # every node of the scaled cluster registered


def test_mosaic_up_refuses_a_busy_port_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "libs.client.cli", "up", "--no-live", "--port", str(port),
             "--data-dir", str(tmp_path)],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert proc.returncode != 0
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and f"port {port}" in err[0] and "--port" in err[0]
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--nodes", "0"], "--nodes"), (["--cluster", "/nonexistent.json"], "--cluster")],
)
def test_mosaic_up_bad_cluster_flags(tmp_path: Path, flags: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "libs.client.cli", "up", "--no-live", *flags,
         "--port", str(free_port()), "--data-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
