"""A training-like job that Mosaic can preempt and resume: ``libs.runtime`` in use.

    python examples/train_toy.py --steps 200 --step-s 0.05 --batch 32

Pure Python; with torch importable it also does a small matrix product per step (on the GPU
when there is one, timed with CUDA events in the task exporter's
``mosaic_task_cuda_seconds_total``). Its whole state is a step counter and a "weight"; on the
checkpoint signal it saves them to ``$MOSAIC_CHECKPOINT_DIR/toy.json`` (atomically) and exits
0, and a later attempt of the same job starts from there. It prints one line per step
(``step N``) and how it started (``start step=K resume_progress=P``), which is what the tests
read to tell a resumed job from a restarted one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

try:
    import libs.runtime as runtime
except ImportError:  # run from a checkout, not installed: the package is beside this folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import libs.runtime as runtime

try:
    import torch
except ImportError:
    torch = None


def load(path: Path) -> dict[str, Any] | None:
    """The saved state, or None on a first attempt (or a checkpoint that does not parse:
    better to start over than to resume from garbage)."""
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(state, dict) and isinstance(state.get("step"), int)
    return state if ok else None


def save(path: Path, state: dict[str, Any]) -> None:
    """Write then rename: a checkpoint cut short by SIGKILL leaves the previous one intact."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    print(f"checkpoint saved at step {state['step']}", flush=True)


def work(state: dict[str, Any], step_s: float, rt: runtime.Runtime) -> None:
    """One step: sleep (the stand-in for compute), and a real product when torch is here."""
    time.sleep(step_s)
    state["weight"] = state["weight"] * 0.99 + 0.01 * state["step"]
    if torch is not None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        with rt.cuda_section():
            x = torch.ones(256, 256, device=device)
            state["weight"] += float((x @ x).mean().item()) * 0.0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="train_toy")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step-s", type=float, default=0.05)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--empty-cache-every-s", type=float, default=None)
    args = p.parse_args(argv)
    state: dict[str, Any] = {"step": 0, "weight": 0.0}
    rt = runtime.start(save=lambda: save(path, state), empty_cache_every_s=args.empty_cache_every_s)
    path = rt.checkpoint_dir / "toy.json"
    state = load(path) or state
    print(f"start step={state['step']} resume_progress={rt.resume_progress}", flush=True)
    while state["step"] < args.steps:
        work(state, args.step_s, rt)
        state["step"] += 1
        print(f"step {state['step']}", flush=True)
        rt.progress(state["step"] / args.steps)
        rt.step(samples=args.batch)  # saves and exits here when the executor asked
    save(path, state)
    rt.close()
    print(f"done at step {state['step']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
