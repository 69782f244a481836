"""Shrink: an elastic job gives GPUs back instead of stopping (the definitions).

A shrink is a move (``stages.preempt``) whose job resumes at once, on fewer GPUs of the node it
leaves: the job saves a checkpoint, its attempt ends, and it waits again as a *resized* job of
``shrink_to`` GPUs with its room held on that same node (the scheduler's room hold), so it
starts again as soon as its save is done, without waiting for anyone's end. What it frees goes
to the job the move makes room for. Both drivers apply a shrink the same way: the simulator
resizes its job when the checkpoint is saved; live, the executor's ``Preempted`` names the new
size (``Preempted.resize_gpus``, from the checkpoint command's ``shrink_to``) and every read
model that folds it resizes the job with ``resized``.

The resized job's work: its remaining share of the work is kept (``progress``, a fraction) and
its runtime grows by the GPU ratio (``est_runtime_s x gpus / shrink_to``): data-parallel
scaling taken as linear, the assumption elastic schedulers make to size a job (Pollux, OSDI'21,
measures goodput instead; Mosaic has no goodput model yet). Host memory and CPUs are kept as
asked (the job still fits where it was). Only whole-GPU jobs shrink; never below
``Elastic.min_gpus`` (nor below 1); the size only goes down (a shrunk job grows back only by
being placed again at its new size: growing in place is not built).
"""

from __future__ import annotations

from proto.jobs import JobSpec, with_changes


def shrink_floor(spec: JobSpec) -> int | None:
    """The fewest GPUs ``spec`` may run on after a shrink, or None when it cannot shrink (not
    elastic, fractional, or already at its minimum)."""
    if spec.elastic is None or spec.gpus < 1.0 or spec.kind == "inference":
        return None
    floor = max(1, int(spec.elastic.min_gpus))
    return floor if floor < round(spec.gpus) else None


def shrink_target(spec: JobSpec, free_needed: float) -> int | None:
    """The size ``spec`` shrinks to so that it frees at least ``free_needed`` GPUs, staying as
    large as it can (it loses the least speed); None when even its floor frees too few."""
    floor = shrink_floor(spec)
    if floor is None:
        return None
    held = round(spec.gpus)
    k = held - max(1, int(-(-free_needed // 1)))  # free whole GPUs: round the need up
    return k if k >= floor else None


def size_error(spec: JobSpec, shrink_to: int) -> str:
    """Why ``spec`` may not shrink to ``shrink_to`` GPUs ("" when it may): the one check
    behind a scheduler's verdict on an intent, ``resized`` and the read models' fold."""
    floor = shrink_floor(spec)
    if floor is None:
        return "cannot shrink: not an elastic whole-GPU job above its minimum"
    held = round(spec.gpus)
    if not floor <= shrink_to < held:
        return f"shrink_to: {shrink_to} is not in [{floor}, {held - 1}] (min_gpus .. held - 1)"
    return ""


def resized(spec: JobSpec, shrink_to: int) -> JobSpec:
    """``spec`` as it runs after a shrink to ``shrink_to`` GPUs (module docstring). Refuses a
    size the job may not take (a bug in the caller, never an input to forgive)."""
    why = size_error(spec, shrink_to)
    if why:
        raise ValueError(f"{spec.id}: {why}")
    return with_changes(
        spec,
        gpus=float(shrink_to),
        est_runtime_s=resized_runtime_s(spec.est_runtime_s, spec.gpus, shrink_to),
    )


def fold_resize(spec: JobSpec, resize_gpus: int) -> JobSpec:
    """``spec`` after a ``Preempted`` that names ``resize_gpus`` (0: not a shrink), as a read
    model folds it: idempotent (a replayed event of a shrink already applied, or of an earlier,
    larger one, changes nothing: sizes only go down) and never raising (an event naming a size
    the job may not take is ignored, the job keeps its size)."""
    if not resize_gpus or size_error(spec, resize_gpus):
        return spec
    return resized(spec, resize_gpus)


def resized_runtime_s(runtime_s: float, gpus: float, shrink_to: int) -> float:
    """A runtime on ``gpus`` GPUs as it becomes on ``shrink_to`` (the same linear scaling)."""
    return runtime_s * round(gpus) / shrink_to
