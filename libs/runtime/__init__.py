"""The job side of Mosaic: checkpoint on signal, progress, cache release, a task exporter.

Standard library only, relative imports only: copy this folder into a job's image (as
``mosaic_runtime/`` if you like) and it works without the rest of Mosaic, without torch, and
without a connection to anything. What it agrees with the executor is in
``docs/runtime-contract.md`` ("Job side")::

    import libs.runtime as runtime

    rt = runtime.start(save=save_checkpoint)    # installs the checkpoint signal's handler
    step = load_checkpoint(rt.checkpoint_dir)   # the same folder in every attempt of the job
    while step < total:
        train_one_step()
        step += 1
        rt.progress(step / total)               # the fraction of the whole job
        rt.step(samples=batch_size)             # step time; saves and exits if asked to

``rt.resume_progress`` is where the placer resumed the job (0 on a first attempt). With torch
imported, ``with rt.cuda_section(): ...`` times CUDA work with CUDA events, and
``empty_cache_every_s`` (or ``MOSAIC_EMPTY_CACHE_EVERY_S``) releases PyTorch's cached memory on
a timer. ``metrics_port`` (or ``MOSAIC_TASK_METRICS_PORT``) serves ``/metrics``.
"""

from __future__ import annotations

from typing import Any

from .checkpoint import CheckpointSignal, signal_number
from .core import Runtime
from .exporter import Exporter
from .progress import ProgressWriter

__all__ = ["CheckpointSignal", "Exporter", "ProgressWriter", "Runtime", "signal_number", "start"]


def start(save: Any = None, **options: Any) -> Runtime:
    """A ``Runtime`` for this process (see ``Runtime`` for ``options``)."""
    return Runtime(save, **options)
