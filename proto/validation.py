"""Validation of a job, in one place: the gateway, the services reading the bus, the CLI and the
simulator all call it.

A refusal names the field and says what is wrong, so a producer can fix the job without reading
our code. Two layers, one set of rules:

- ``revalidate_spec``: what holds for a job whatever the cluster and whatever the time. Every
  service re-checks a spec it takes from the bus with it (rule 6: the bus is a trust boundary
  too), so a ``Submitted`` with ``gpus`` -1 published straight onto NATS is refused, not fed to
  the scheduler. It has no "deadline in the past" check: an old, valid job replays.
- ``validate_job``: the gateway's admission, ``revalidate_spec`` plus what depends on the
  cluster (known GPU models, the largest GPU memory) and on the clock (the deadline).

The bounds are named constants below and listed in ``docs/runtime-contract.md``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

import msgspec

from proto.commands import CheckpointCommand, RunCommand
from proto.events import Submitted
from proto.gpus import CATALOG, canonical_model, known_names, matches
from proto.jobs import JobSpec

_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
SERVICE_ID = re.compile(r"^[A-Za-z0-9_]{1,48}$")  # an inference service (proto.inference)

# --- bounds ---------------------------------------------------------------------------------
MAX_GPUS_PER_JOB = 64
MIN_GPU_FRACTION = 0.01  # below a hundredth of a GPU a "share" is a rounding error (1e-320!)
MAX_GPU_MEM_GB = 1024.0  # per GPU; the gateway's catalog/cluster bound is tighter
MAX_HOST_MEM_GB = 16384.0
MAX_CPUS = 4096.0
HORIZON_S = 365 * 86400.0  # est_runtime_s, and a deadline's distance from submission, at most
MAX_CONSTRAINTS = 16
MAX_CONSTRAINT_CHARS = 64
MAX_COMMAND_BYTES = 16 * 1024  # UTF-8; a longer script belongs in a file the command runs
# A whole encoded JobSpec. The bounds above keep a job near 18 KB; this catches what they miss
# (a field added later) and keeps every message carrying a spec (Submitted, RunCommand, the
# ranked queue's entries) far below NATS' max payload (1 MiB by default).
MAX_JOB_BYTES = 32 * 1024
# Signals a job may ask to be checkpointed with: the ones a process can catch and that no
# terminal or runtime sends by itself (SIGKILL and SIGSTOP cannot be caught; SIGCHLD, SIGPIPE,
# SIGSEGV... mean something else already).
CHECKPOINT_SIGNALS: tuple[str, ...] = (
    "SIGUSR1",
    "SIGUSR2",
    "SIGTERM",
    "SIGINT",
    "SIGHUP",
    "SIGQUIT",
    "SIGALRM",
    "SIGWINCH",
)
MAX_CHECKPOINT_GRACE_S = 3600.0  # wall seconds; a longer save holds GPUs others wait for

JOB_FIELDS: frozenset[str] = frozenset(JobSpec.__struct_fields__)
_encoder = msgspec.json.Encoder()
_job_decoder = msgspec.json.Decoder(JobSpec, strict=True)


class FieldError(msgspec.Struct, frozen=True):
    field: str
    reason: str


class JobRejected(ValueError):
    """A submission that cannot be accepted; ``errors`` says which fields and why."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("; ".join(f"{e.field}: {e.reason}" for e in errors))


def describe(errors: Iterable[FieldError]) -> str:
    """One line for logs and for the reason of a ``Failed`` event."""
    return "; ".join(f"{e.field}: {e.reason}" for e in errors)


# --- decoding -------------------------------------------------------------------------------


def decode_fields(data: bytes) -> dict[str, msgspec.Raw]:
    """The members of a JSON object, their values left undecoded; unknown fields refused.

    Why refuse them: a misspelt field (``{"gpu": 4}``) silently dropped becomes a 1-GPU job the
    producer never asked for. Stored records keep decoding leniently (``JobSpec`` itself does
    not forbid unknown fields), so a newer writer's extra field never breaks an older reader.
    """
    try:
        raw = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    except msgspec.ValidationError:
        raise JobRejected([FieldError("body", "must be a JSON object (a JobSpec)")]) from None
    except msgspec.DecodeError as exc:
        raise JobRejected([FieldError("body", f"not valid JSON: {exc}")]) from None
    except RecursionError:
        raise JobRejected([FieldError("body", "JSON nested too deeply")]) from None
    unknown = sorted(k for k in raw if k not in JOB_FIELDS)
    if unknown:
        known = ", ".join(sorted(JOB_FIELDS))
        raise JobRejected([FieldError(k[:64], f"unknown field; known: {known}") for k in unknown])
    return raw


def decode_job(data: bytes | str) -> JobSpec:
    """Decode JSON into a JobSpec, strictly (no ``"4"`` for 4); an error names the field."""
    try:
        return _job_decoder.decode(data)
    except msgspec.ValidationError as exc:
        text = str(exc)
        m = re.search(r"at `\$\.([A-Za-z_]+)", text)
        raise JobRejected([FieldError(m.group(1) if m else "body", text)]) from None
    except msgspec.DecodeError as exc:
        raise JobRejected([FieldError("body", f"not valid JSON: {exc}")]) from None
    except RecursionError:
        raise JobRejected([FieldError("body", "JSON nested too deeply")]) from None


# --- the rules ------------------------------------------------------------------------------


def _number(errs: list[FieldError], field: str, value: float, low: float, high: float) -> bool:
    """``low`` <= value <= ``high`` and finite, else an error; True when it is sound."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        errs.append(FieldError(field, f"must be a finite number, got {value!r}"))
        return False
    if not low <= value <= high:
        errs.append(FieldError(field, f"must be between {low:g} and {high:g}, got {value:g}"))
        return False
    return True


def _positive(errs: list[FieldError], field: str, value: float, high: float) -> None:
    if _number(errs, field, value, 0.0, high) and value <= 0:
        errs.append(FieldError(field, f"must be > 0, got {value:g}"))


def _deadline(spec: JobSpec, errs: list[FieldError]) -> None:
    """Finite, and at most ``HORIZON_S`` after the submission (a time in the record, so a
    replayed job is judged as it was on arrival)."""
    sub = spec.submit_time
    if sub is not None and not _number(errs, "submit_time", sub, -math.inf, math.inf):
        return
    if spec.deadline is None or not _number(errs, "deadline", spec.deadline, 0.0, math.inf):
        return
    if sub is not None and spec.deadline > sub + HORIZON_S:
        errs.append(FieldError("deadline", f"more than {HORIZON_S / 86400:g} days ahead"))


def _strings(spec: JobSpec, errs: list[FieldError]) -> None:
    if not _ID.fullmatch(spec.id):
        errs.append(FieldError("id", "must be 1-64 characters of letters, digits, '-' or '_'"))
    if not spec.tenant or not _ID.fullmatch(spec.tenant):
        errs.append(FieldError("tenant", "must be 1-64 characters of letters, digits, '-' or '_'"))
    if len(spec.constraints) > MAX_CONSTRAINTS:
        errs.append(FieldError("constraints", f"at most {MAX_CONSTRAINTS} GPU models"))
    elif any(not c or len(c) > MAX_CONSTRAINT_CHARS for c in spec.constraints):
        errs.append(
            FieldError("constraints", f"each must be 1-{MAX_CONSTRAINT_CHARS} characters long")
        )
    if spec.service and (not SERVICE_ID.fullmatch(spec.service) or spec.kind != "inference"):
        errs.append(
            FieldError(
                "service", "a replica's service: 1-48 letters, digits or '_', kind inference"
            )
        )
    if len(spec.framework) > 32 or (spec.framework and not _ID.fullmatch(spec.framework)):
        errs.append(FieldError("framework", "at most 32 letters, digits, '-' or '_' (or empty)"))
    if spec.command is not None:
        size = len(spec.command.encode("utf-8", "surrogatepass"))
        if size > MAX_COMMAND_BYTES:
            errs.append(
                FieldError("command", f"at most {MAX_COMMAND_BYTES} bytes, got {size} bytes")
            )
        elif "\x00" in spec.command:
            errs.append(FieldError("command", "must not contain NUL characters"))


def _checkpoint(spec: JobSpec, errs: list[FieldError]) -> None:
    """The checkpoint signal is one a job can catch; its grace a finite (0, 3600] seconds."""
    if spec.checkpoint_signal not in CHECKPOINT_SIGNALS:
        got = repr(spec.checkpoint_signal)[:80]
        known = ", ".join(CHECKPOINT_SIGNALS)
        errs.append(FieldError("checkpoint_signal", f"must be one of {known}, got {got}"))
    _positive(errs, "checkpoint_grace_s", spec.checkpoint_grace_s, MAX_CHECKPOINT_GRACE_S)


MAX_LATENCY_MS = 3_600_000.0  # an hour: beyond that it is not a latency target


def _latency(spec: JobSpec, errs: list[FieldError]) -> None:
    """A latency target and a solo latency are finite positive milliseconds, the solo figure
    at most the target (a job slower than its target alone cannot meet it beside anyone)."""
    target, solo = spec.latency_p99_ms, spec.solo_latency_p99_ms
    before = len(errs)
    for name, value in (("latency_p99_ms", target), ("solo_latency_p99_ms", solo)):
        if value is not None:
            _positive(errs, name, value, MAX_LATENCY_MS)
    if len(errs) == before and target is not None and solo is not None and solo > target:
        errs.append(
            FieldError("solo_latency_p99_ms", f"{solo:g} ms alone is above the target {target:g}")
        )


def revalidate_spec(spec: JobSpec) -> list[FieldError]:
    """Every reason ``spec`` is unsound whatever the cluster and the clock. Empty means sound.

    Services call it on each spec they take from the bus; the gateway (through
    ``validate_job``) on each submission. It never raises, whatever the values.
    """
    errs: list[FieldError] = []
    _strings(spec, errs)
    if isinstance(spec.priority, bool) or not isinstance(spec.priority, int):
        errs.append(FieldError("priority", f"must be a whole number 0-9, got {spec.priority!r}"))
    elif not 0 <= spec.priority <= 9:
        errs.append(FieldError("priority", f"must be 0-9, got {spec.priority}"))
    gpus_ok = _number(errs, "gpus", spec.gpus, MIN_GPU_FRACTION, MAX_GPUS_PER_JOB)
    if gpus_ok and spec.gpus > 1 and spec.gpus != int(spec.gpus):
        errs.append(FieldError("gpus", f"above 1 must be a whole number, got {spec.gpus}"))
    _positive(errs, "gpu_mem_gb", spec.gpu_mem_gb, MAX_GPU_MEM_GB)
    _number(errs, "host_mem_gb", spec.host_mem_gb, 0.0, MAX_HOST_MEM_GB)
    _number(errs, "cpus", spec.cpus, 0.0, MAX_CPUS)
    _number(errs, "energy_sensitivity", spec.energy_sensitivity, 0.0, 1.0)
    _positive(errs, "est_runtime_s", spec.est_runtime_s, HORIZON_S)
    _deadline(spec, errs)
    _checkpoint(spec, errs)
    _latency(spec, errs)
    if spec.elastic is not None:
        e = spec.elastic
        if not 1 <= e.min_gpus <= e.max_gpus <= MAX_GPUS_PER_JOB:
            errs.append(
                FieldError(
                    "elastic",
                    f"needs 1 <= min <= max <= {MAX_GPUS_PER_JOB}, got {e.min_gpus}:{e.max_gpus}",
                )
            )
        elif math.isfinite(spec.gpus) and not e.min_gpus <= spec.gpus <= e.max_gpus:
            errs.append(
                FieldError("elastic", f"gpus {spec.gpus:g} outside {e.min_gpus}:{e.max_gpus}")
            )
    if not errs:
        size = len(_encoder.encode(spec))
        if size > MAX_JOB_BYTES:
            errs.append(FieldError("job", f"encodes to {size} bytes, at most {MAX_JOB_BYTES}"))
    return errs


def validate_job(
    spec: JobSpec, *, now: float, cluster_models: Iterable[tuple[str, float]] = ()
) -> list[FieldError]:
    """Every reason ``spec`` cannot be accepted at ``now``. Empty means valid.

    ``cluster_models`` are (gpu_model, gpu_mem_gb) pairs present in the cluster: a model the
    catalog does not list is still a valid constraint when the cluster has it, and its memory
    counts towards the largest GPU memory available.
    """
    cluster = list(cluster_models)
    errs = revalidate_spec(spec)
    bad = {e.field for e in errs}
    if "gpu_mem_gb" not in bad:
        largest = max([s.mem_gb for s in CATALOG.values()] + [m for _, m in cluster])
        if spec.gpu_mem_gb > largest:
            errs.append(
                FieldError(
                    "gpu_mem_gb",
                    f"{spec.gpu_mem_gb:g} GB per GPU is more than any "
                    f"known GPU has (largest {largest:g} GB)",
                )
            )
            bad.add("gpu_mem_gb")
    if "constraints" not in bad:
        _constraints(spec, cluster, errs, check_mem="gpu_mem_gb" not in bad)
    if spec.deadline is not None and "deadline" not in bad:
        if spec.deadline <= now:
            errs.append(FieldError("deadline", "is in the past"))
        elif spec.deadline > now + HORIZON_S:
            errs.append(FieldError("deadline", f"more than {HORIZON_S / 86400:g} days ahead"))
    return errs


def _constraints(
    spec: JobSpec, cluster: list[tuple[str, float]], errs: list[FieldError], *, check_mem: bool
) -> None:
    known = known_names([m for m, _ in cluster])
    unknown = [
        c for c in spec.constraints if c.lower() not in known and canonical_model(c) not in known
    ]
    for c in unknown:
        errs.append(FieldError("constraints", f"unknown GPU model {c!r}"))
    if spec.constraints and not unknown and check_mem:
        # the constraints are alternatives: refuse only when none of them has enough memory
        mems = [
            s.mem_gb for s in CATALOG.values() if any(matches(c, s.model) for c in spec.constraints)
        ]
        mems += [m for model, m in cluster if any(matches(c, model) for c in spec.constraints)]
        if mems and spec.gpu_mem_gb > max(mems):
            errs.append(
                FieldError(
                    "gpu_mem_gb",
                    f"{spec.gpu_mem_gb:g} GB per GPU does not fit on "
                    f"{'|'.join(spec.constraints)} (at most {max(mems):g} GB)",
                )
            )


def revalidate_submitted(event: Submitted) -> list[FieldError]:
    """``revalidate_spec`` of a ``Submitted`` event, plus what the event adds: the spec is the
    job the event is about, and its time is a finite number (it is the enqueue time when the
    spec carries no ``submit_time``)."""
    errs = revalidate_spec(event.spec)
    if event.spec.id != event.job_id:
        errs.append(FieldError("id", f"spec {event.spec.id!r} in an event for {event.job_id!r}"))
    _number(errs, "time", event.time, -math.inf, math.inf)
    return errs


def revalidate_command(cmd: RunCommand) -> list[FieldError]:
    """Every reason a ``node.<node>.run`` command is unsound (its spec included).

    The executor calls it before starting anything: a command that fails it did not come from a
    sound placer, so it is dead-lettered rather than answered with a ``Failed`` event (which
    would let whoever forged it end someone else's job).
    """
    a = cmd.allocation
    errs = [FieldError(f"allocation.spec.{e.field}", e.reason) for e in _spec_errors(a.spec)]
    _number(errs, "runtime_s", cmd.runtime_s, 0.0, math.inf)  # scaled per GPU model
    _number(errs, "progress", cmd.progress, 0.0, 1.0)
    _number(errs, "allocation.gpu_share", a.gpu_share, MIN_GPU_FRACTION, 1.0)
    _number(errs, "allocation.gpu_mem_gb", a.gpu_mem_gb, 0.0, MAX_GPU_MEM_GB)
    _number(errs, "allocation.host_mem_gb", a.host_mem_gb, 0.0, MAX_HOST_MEM_GB)
    _number(errs, "allocation.cpus", a.cpus, 0.0, MAX_CPUS)
    if not a.gpu_indices or len(a.gpu_indices) > MAX_GPUS_PER_JOB:
        errs.append(FieldError("allocation.gpu_indices", f"1-{MAX_GPUS_PER_JOB} GPUs"))
    elif any(i < 0 for i in a.gpu_indices) or len(set(a.gpu_indices)) != len(a.gpu_indices):
        errs.append(FieldError("allocation.gpu_indices", "must be distinct and >= 0"))
    if a.attempt < 1:
        errs.append(FieldError("allocation.attempt", f"must be >= 1, got {a.attempt}"))
    if cmd.gang and (
        len(cmd.gang) > MAX_GPUS_PER_JOB
        or not all(sound_id(n) for n in cmd.gang)
        or len(set(cmd.gang)) != len(cmd.gang)
        or a.node not in cmd.gang
    ):
        errs.append(FieldError("gang", "distinct sound node ids, this part's node among them"))
    _number(errs, "gang_start_timeout_s", cmd.gang_start_timeout_s, 0.0, 86400.0)
    return errs


MAX_CHECKPOINT_COST_S = 86400.0  # Mosaic seconds a simulated checkpoint may take


def revalidate_checkpoint_command(cmd: CheckpointCommand) -> list[FieldError]:
    """Every reason a ``node.<node>.checkpoint`` command is unsound: the executor dead-letters
    it rather than act on a job id that is no id or a cost that is no duration."""
    errs: list[FieldError] = []
    if not sound_id(cmd.job_id):
        errs.append(FieldError("job_id", "must be 1-64 characters of letters, digits, '-' or '_'"))
    if cmd.attempt is not None and (isinstance(cmd.attempt, bool) or cmd.attempt < 1):
        errs.append(FieldError("attempt", f"must be >= 1, got {cmd.attempt!r}"))
    if cmd.cost_s is not None:
        _number(errs, "cost_s", cmd.cost_s, 0.0, MAX_CHECKPOINT_COST_S)
    if isinstance(cmd.shrink_to, bool) or not isinstance(cmd.shrink_to, int) or cmd.shrink_to < 0:
        errs.append(FieldError("shrink_to", f"must be a GPU count >= 0, got {cmd.shrink_to!r}"))
    return errs


def _spec_errors(spec: JobSpec | None) -> list[FieldError]:
    return [] if spec is None else revalidate_spec(spec)


def sound_id(value: str) -> bool:
    """A job or tenant id: 1-64 letters, digits, '-' or '_' (safe as a NATS subject token)."""
    return isinstance(value, str) and bool(_ID.fullmatch(value))


def sound_progress(progress: float) -> bool:
    """A checkpoint's progress a service can use: a finite fraction in [0, 1]."""
    return isinstance(progress, int | float) and math.isfinite(progress) and 0 <= progress <= 1


def check_job(
    spec: JobSpec, *, now: float, cluster_models: Iterable[tuple[str, float]] = ()
) -> None:
    errs = validate_job(spec, now=now, cluster_models=cluster_models)
    if errs:
        raise JobRejected(errs)
