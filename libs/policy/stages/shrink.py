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
``Elastic.min_gpus`` (nor below 1).

A shrunk job grows back (``stages.grow``, issue 16) by the same move the other way: a resize to
more GPUs of the same node, the runtime scaled by the same linear rule (``resized`` takes any
size in the job's elastic range, ``resize_error``). Sizes are therefore no longer monotone: a
read model folds a ``Preempted`` once per attempt (the attempt the event ends keys it), and the
fold itself sets the event's explicit new size, so a replay of the same event is a no-op.
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


def resize_error(spec: JobSpec, to_gpus: int) -> str:
    """Why ``spec`` may not be resized to ``to_gpus`` GPUs ("" when it may): a shrink
    (``size_error``) or a grow, to at most ``Elastic.max_gpus`` (the grow rule's own bound, the
    size the job asked, is ``stages.grow``'s)."""
    held = round(spec.gpus)
    if to_gpus < held or spec.elastic is None:
        return size_error(spec, to_gpus)
    if spec.gpus < 1.0 or spec.kind == "inference":
        return "cannot grow: not an elastic whole-GPU training job"
    if not held < to_gpus <= int(spec.elastic.max_gpus):
        return f"grow to {to_gpus}: not in [{held + 1}, {spec.elastic.max_gpus}] (max_gpus)"
    return ""


def resized(spec: JobSpec, shrink_to: int) -> JobSpec:
    """``spec`` as it runs after a resize to ``shrink_to`` GPUs (a shrink, or a grow back:
    module docstring). Refuses a size the job may not take (a bug in the caller, never an
    input to forgive)."""
    why = resize_error(spec, shrink_to)
    if why:
        raise ValueError(f"{spec.id}: {why}")
    return with_changes(
        spec,
        gpus=float(shrink_to),
        est_runtime_s=resized_runtime_s(spec.est_runtime_s, spec.gpus, shrink_to),
    )


def fold_resize(spec: JobSpec, resize_gpus: int) -> JobSpec:
    """``spec`` after a ``Preempted`` that names ``resize_gpus`` (0: not a resize), as a read
    model folds it: the event names the new size itself, so the same event folded twice
    changes nothing (the job has that size already); an *earlier* event folded again after a
    later resize would undo it, so each read model folds one ``Preempted`` per attempt (keyed
    on ``Preempted.attempt``). Never raises: an event naming a size the job may not take is
    ignored, the job keeps its size."""
    if not resize_gpus or resize_gpus == round(spec.gpus) or resize_error(spec, resize_gpus):
        return spec
    return resized(spec, resize_gpus)


def resized_runtime_s(runtime_s: float, gpus: float, shrink_to: int) -> float:
    """A runtime on ``gpus`` GPUs as it becomes on ``shrink_to`` (the same linear scaling, a
    shrink's or a grow's)."""
    return runtime_s * round(gpus) / shrink_to
