"""Energy arithmetic: what a job costs on a GPU model, and the idle floor of the cluster.

Pure numbers from ``ProfileTable``. Energy per unit of work is the figure placement compares:
a faster GPU drawing more power can still be the greener choice (A100 vs T4 on ResNet-50).
A "unit of work" is one second of the job on the reference GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from libs.policy.profiles import ProfileTable
from proto.jobs import JobSpec

J_PER_KWH = 3.6e6


def gpu_equivalents(spec: JobSpec) -> float:
    """GPUs a job keeps busy: its count, or its share of one GPU."""
    return float(spec.gpus)


def job_energy_kwh(spec: JobSpec, model: str, profiles: ProfileTable) -> float:
    """Active energy of ``spec`` run to completion on ``model`` (above idle power: no)."""
    runtime_s = profiles.runtime_s(spec, model)
    power_w = profiles.power_w(model, spec.workload_class)
    return runtime_s * power_w * gpu_equivalents(spec) / J_PER_KWH


def energy_per_work_j(model: str, workload_class: str, profiles: ProfileTable) -> float:
    """Joules per GPU per reference-second of work: active power / relative speed."""
    return profiles.power_w(model, workload_class) / profiles.speed(model, workload_class)


def energy_per_work_matrix(
    models: Sequence[str], classes: Sequence[str], profiles: ProfileTable
) -> np.ndarray:
    """float[len(models), len(classes)] of J per reference-second, for vectorised scoring."""
    return profiles.power_matrix(models, classes) / profiles.speed_matrix(models, classes)


def idle_energy_kwh(model: str, gpus: float, duration_s: float, profiles: ProfileTable) -> float:
    """Energy that ``gpus`` idle GPUs of ``model`` draw over ``duration_s``."""
    return profiles.idle_power_w(model) * gpus * duration_s / J_PER_KWH


def dynamic_energy_kwh(spec: JobSpec, model: str, profiles: ProfileTable) -> float:
    """Energy the job adds above the idle floor the GPUs draw anyway."""
    runtime_s = profiles.runtime_s(spec, model)
    extra_w = max(0.0, profiles.power_w(model, spec.workload_class) - profiles.idle_power_w(model))
    return runtime_s * extra_w * gpu_equivalents(spec) / J_PER_KWH


def idle_floor_w(models: Sequence[str], idle_gpus: np.ndarray, profiles: ProfileTable) -> float:
    """Power drawn by idle GPUs: ``idle_gpus[i]`` idle GPUs of ``models[i]``."""
    idle = np.array([profiles.idle_power_w(m) for m in models], dtype=float)
    return float(np.dot(idle, np.asarray(idle_gpus, dtype=float)))
