"""Filter (Kubernetes "Filter" stage), the definitions: one named function per rule, each a
boolean mask over the nodes of a ``ClusterView``; ``STATIC`` lists the rules that depend only
on a node's shape, with the reason each reports ("why is my job pending").

Static filters (constraints, GPU count, GPU memory, host memory/CPU totals) depend only on the
node's shape: failing them on every node means the job can never run (``filters.never_fits``).
Dynamic filters (free GPUs, free host memory, free CPUs, cordon, thermal) change with time.
GPU memory is a HARD rule: a job never lands on a GPU with less memory than it asks for.

The pass applies the static rules once per request shape (``filters.static_mask``) and the
dynamic ones in one compiled loop (``fast.fit``), checked against these
(``tests/policy/test_kernels.py``, ``test_fastpath.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from proto.gpus import matches
from proto.jobs import JobSpec


def shape_key(spec: JobSpec) -> tuple:
    """What decides where a job fits (GPUs, GPU memory, host memory, CPUs, constraints): jobs
    with the same key fit on the same nodes, so per-shape answers are memoised under it."""
    return (spec.gpus, spec.gpu_mem_gb, spec.host_mem_gb, spec.cpus, spec.constraints)


def is_fractional(spec: JobSpec) -> bool:
    return spec.gpus < 1.0 - EPS


def whole_gpus(spec: JobSpec) -> int:
    """GPUs a whole-GPU job needs (a fractional job needs part of one)."""
    return 1 if is_fractional(spec) else round(spec.gpus)


def model_allowed(constraints: Sequence[str], model: str) -> bool:
    return not constraints or any(matches(c, model) for c in constraints)


# --- static ---------------------------------------------------------------------------------
def f_constraints(spec: JobSpec, view: ClusterView) -> np.ndarray:
    if not spec.constraints:
        return np.ones(len(view.node_ids), dtype=bool)
    ok = np.array([model_allowed(spec.constraints, m) for m in view.models], dtype=bool)
    return ok[view.model_idx]


def f_gpu_count(spec: JobSpec, view: ClusterView) -> np.ndarray:
    return view.gpu_total >= whole_gpus(spec)


def f_gpu_memory(spec: JobSpec, view: ClusterView) -> np.ndarray:
    return view.gpu_mem_gb >= spec.gpu_mem_gb - EPS


def f_host_memory_total(spec: JobSpec, view: ClusterView) -> np.ndarray:
    return view.host_mem_gb >= spec.host_mem_gb - EPS


def f_cpus_total(spec: JobSpec, view: ClusterView) -> np.ndarray:
    return view.cpus >= spec.cpus - EPS


# --- dynamic --------------------------------------------------------------------------------
def f_cordon(spec: JobSpec, view: ClusterView) -> np.ndarray:
    return ~view.cordoned


def f_thermal(spec: JobSpec, view: ClusterView, cfg: PolicyConfig) -> np.ndarray:
    return ~(view.temp_c >= cfg.thermal_max_c)  # NaN (unknown) passes


def frac_slot_ok(spec: JobSpec, view: ClusterView) -> np.ndarray:
    """bool[N, Gmax]: GPU slots with the job's share and its GPU memory free."""
    return (view.gpu_free >= spec.gpus - EPS) & (view.gpu_mem_free_gb >= spec.gpu_mem_gb - EPS)


def f_free_gpus(spec: JobSpec, view: ClusterView) -> np.ndarray:
    """Gang: ``gpus`` whole free GPUs on ONE node; fractional: one GPU with the share free."""
    if is_fractional(spec):
        return frac_slot_ok(spec, view).any(axis=1)
    return view.whole_free >= whole_gpus(spec)


def f_host_memory(spec: JobSpec, view: ClusterView) -> np.ndarray:
    return view.host_mem_free_gb >= spec.host_mem_gb - EPS


def f_cpus(spec: JobSpec, view: ClusterView) -> np.ndarray:
    return view.cpus_free >= spec.cpus - EPS


StaticFilter = Callable[[JobSpec, ClusterView], np.ndarray]
# (reason, filter) in the order reasons are reported
STATIC: tuple[tuple[str, StaticFilter], ...] = (
    ("Constraints", f_constraints),
    ("GpuCount", f_gpu_count),
    ("GpuMemory", f_gpu_memory),
    ("HostMemory", f_host_memory_total),
    ("Cpus", f_cpus_total),
)
