"""The GPU share a job was given, as environment variables (issue 16).

Why: a fractional allocation (``gpu_share`` < 1) is only a number in the ledger; the job's
process must learn it to stay inside it. What enforces each variable is in
docs/runtime-contract.md ("Sharing a GPU"); in short:

* ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (share x 100, rounded, 1-100; fractional jobs only):
  the CUDA driver caps the job's SMs at that share, ONLY when an MPS control daemon runs on
  the node (without it the variable is ignored and the job may use the whole GPU);
* ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (``0=<MiB>M``; fractional jobs only): the same daemon
  limits the job's device memory (Volta or newer); ordinal 0 is the one GPU the job sees;
* ``MOSAIC_GPU_SHARE`` and ``MOSAIC_GPU_MEMORY_LIMIT_GB`` (every job) and
  ``MOSAIC_GPU_MEMORY_FRACTION`` (memory cap / the GPU's memory): for the job to apply itself,
  e.g. ``torch.cuda.set_per_process_memory_fraction``; nothing enforces them;
* ``PYTORCH_CUDA_ALLOC_CONF`` (fractional jobs, unless the runner's extra variables set one):
  a hint to PyTorch's caching allocator to hand cached blocks back before it reaches the
  job's memory fraction (``garbage_collection_threshold``, which acts only under a
  per-process fraction) and to grow segments instead of reserving large fixed ones
  (``expandable_segments``), so a job inside a cap wastes less of it. A hint; PyTorch has
  no hard cap in this variable.
"""

from __future__ import annotations

from collections.abc import Mapping

from proto.ledger import Allocation
from proto.nodes import NodeSpec

EPS = 1e-9
ALLOC_CONF_HINT = "garbage_collection_threshold:0.8,expandable_segments:True"


def mps_thread_percentage(share: float) -> int:
    """The MPS active-thread percentage of a share of one GPU: share x 100, rounded, 1-100
    (a 0.004 share still needs a thread to run on)."""
    return max(1, min(100, round(share * 100)))


def share_env(
    alloc: Allocation, node: NodeSpec, operator_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The share variables for ``alloc`` on ``node`` (module docstring). ``operator_env``: the
    variables the runner already sets for every job (``extra_env``); its allocator config wins."""
    share = float(alloc.gpu_share)
    mem_gb = float(alloc.gpu_mem_gb)
    env = {
        "MOSAIC_GPU_SHARE": repr(share),
        "MOSAIC_GPU_MEMORY_LIMIT_GB": repr(mem_gb),
    }
    if node.gpu_mem_gb > 0:
        env["MOSAIC_GPU_MEMORY_FRACTION"] = repr(min(1.0, mem_gb / node.gpu_mem_gb))
    if share < 1.0 - EPS:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(mps_thread_percentage(share))
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={max(1, int(mem_gb * 1024))}M"
        if "PYTORCH_CUDA_ALLOC_CONF" not in (operator_env or {}):
            env["PYTORCH_CUDA_ALLOC_CONF"] = ALLOC_CONF_HINT
    return env
