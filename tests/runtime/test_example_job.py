"""The example job (examples/train_toy.py) through a local-mode executor on a real NATS server:
run → checkpoint command → it saves on its signal → Checkpointed with the progress it reported,
Preempted → attempt 2 with that progress → it resumes from its checkpoint → Completed. The
job is a real process (run as nobody when the tests run as root) and the signal a real one."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from libs.bus import Bus
from proto.events import Checkpointed, Completed, Preempted, Started
from proto.jobs import JobSpec
from tests.runtime._jobs import checkpoint, progress_record, run, until
from tests.services.test_executor import Harness, _start, work_root  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]
STEPS = 60
# the job's own interpreter, on the PATH the executor gives jobs: the system's python3, as a
# job image would have it (libs.runtime needs only the standard library). Not this venv's: its
# interpreter may live where the job's user cannot reach (pyenv under /root).
PYTHON = shutil.which("python3", path="/usr/bin:/bin")
pytestmark = pytest.mark.skipif(PYTHON is None, reason="no python3 in /usr/bin:/bin for jobs")


@pytest.fixture
async def local(
    nats_url: str,
    tmp_path: Path,
    work_root: Path,  # noqa: F811
) -> AsyncIterator[Harness]:
    bus = await Bus.connect(nats_url, "test")
    await bus.ensure_topology()
    h = Harness(bus)
    await h.collect()
    task, stop = await _start(
        nats_url, "local", tmp_path, work_root=str(work_root), report_interval=0.5
    )
    yield h
    stop.set()
    assert await asyncio.wait_for(task, 15) == 0
    await bus.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def steps_in(log: Path) -> list[int]:
    return [int(m) for m in re.findall(r"^step (\d+)$", log.read_text(), re.M)]


async def test_the_example_is_checkpointed_and_resumes_where_it_saved(
    local: Harness,
    tmp_path: Path,
    work_root: Path,  # noqa: F811
) -> None:
    port = free_port()
    example = f"python3 {ROOT}/examples/train_toy.py --steps {STEPS} --step-s 0.05"
    command = f"MOSAIC_TASK_METRICS_PORT={port} {example}"  # its task exporter, too
    spec = JobSpec(id="toy", command=command, checkpointable=True, checkpoint_grace_s=20)
    await run(local.bus, spec, runtime_s=3.0)
    await local.wait("toy", 1)
    await until(lambda: (progress_record(work_root, "toy", 1) or {}).get("steps", 0) >= 5)
    page = await asyncio.to_thread(scrape, port)  # the job's own exporter, while it runs
    labels = r'\{attempt="1",job="toy",node="t4-0"\}'
    assert re.search(rf"^mosaic_task_steps_total{labels} \d", page, re.M)
    assert "mosaic_task_steps_per_second{" in page
    await checkpoint(local.bus, "toy", "defrag", attempt=1)
    started, checkpointed, preempted = await local.wait("toy", 3, timeout_s=30)

    saved = json.loads((work_root / "checkpoints" / "toy" / "toy.json").read_text())
    k = saved["step"]
    assert 5 <= k < STEPS
    assert isinstance(started, Started)
    assert isinstance(checkpointed, Checkpointed)
    assert checkpointed.progress == pytest.approx(k / STEPS)  # the job's, not the clock's
    assert checkpointed.reason.startswith("defrag: progress reported by the job")
    assert f"step {k}" in checkpointed.reason and "saved" in checkpointed.reason
    assert isinstance(preempted, Preempted) and preempted.attempt == 1
    assert preempted.reason == "defrag"
    first = steps_in(tmp_path / "logs" / "toy-1.log")
    assert first == list(range(1, k + 1))  # it stopped at the step it saved

    await run(local.bus, spec, runtime_s=3.0, attempt=2, progress=checkpointed.progress)
    *_, again, completed = await local.wait("toy", 5, timeout_s=30)
    assert isinstance(again, Started) and again.attempt == 2
    assert isinstance(completed, Completed)
    log2 = (tmp_path / "logs" / "toy-2.log").read_text()
    assert log2.startswith(f"start step={k} resume_progress={checkpointed.progress!r}")
    assert steps_in(tmp_path / "logs" / "toy-2.log") == list(range(k + 1, STEPS + 1))
    assert f"done at step {STEPS}" in log2
