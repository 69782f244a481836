"""The learnt performance profiles, as the profiler publishes them in KV ``profiles``.

One record under one key (``subjects.PROFILES_KEY``): the whole table is replaced at once, so a
reader sees one version or the next, never half of an update, and the KV revision orders
versions. Each row is one (GPU model, workload class, framework) estimate; framework
``"*"`` pools every framework and is the row the scheduler uses (``libs.policy.
profile_learning``). ``learnt_to`` and ``learnt_ids`` are where the profiler got to in the
lifecycle stream: the newest ``Completed`` time it counted, and the jobs counted at that time,
so a restarted profiler replays the stream without counting a job twice.
"""

from __future__ import annotations

import math

import msgspec

from proto.jobs import WORKLOAD_CLASSES
from proto.validation import FieldError

FORMAT = 1
MAX_ROWS = 4_000  # models x classes x frameworks, within the 1 MiB payload (~150 B a row)
MAX_SPEED = 1e3  # x the reference GPU
MAX_POWER_W = 1e5
MAX_LEARNT_IDS = 1_000


class ProfileRow(msgspec.Struct, frozen=True, kw_only=True):
    """One key's estimate; ``seed``: observations (speed, power_w) collected before it counts."""

    model: str
    workload_class: str
    framework: str
    speed: float
    power_w: float | None = None  # None: no power observed yet
    samples: int
    seed: tuple[tuple[float, float | None], ...] = ()


class ProfilesRecord(msgspec.Struct, frozen=True, kw_only=True):
    version: int  # +1 per publication
    time: float  # Mosaic clock of the publication
    learnt_to: float = 0.0  # Mosaic clock (unix seconds); JSON has no infinity
    learnt_ids: tuple[str, ...] = ()
    rows: tuple[ProfileRow, ...] = ()
    format: int = FORMAT


def _positive(x: float | None, top: float) -> bool:
    return x is None or (isinstance(x, float | int) and math.isfinite(x) and 0 < x <= top)


def revalidate_profiles(rec: ProfilesRecord) -> list[FieldError]:
    """Every reason a record from the bus is unsound (empty: sound). A reader refuses an unsound
    record whole and keeps the table it had."""
    errs: list[FieldError] = []
    if rec.format != FORMAT:
        errs.append(FieldError("format", f"is {rec.format}, expected {FORMAT}"))
    if len(rec.rows) > MAX_ROWS or len(rec.learnt_ids) > MAX_LEARNT_IDS:
        errs.append(FieldError("rows", f"at most {MAX_ROWS} rows and {MAX_LEARNT_IDS} ids"))
    for r in rec.rows[:MAX_ROWS]:
        ok = _positive(r.speed, MAX_SPEED) and _positive(r.power_w, MAX_POWER_W)
        ok = ok and r.workload_class in WORKLOAD_CLASSES
        ok = ok and r.samples >= 1 and len(r.seed) <= r.samples
        ok = ok and all(_positive(s, MAX_SPEED) and _positive(p, MAX_POWER_W) for s, p in r.seed)
        if not ok or not (0 < len(r.model) <= 64 and 0 < len(r.framework) <= 32):
            where = f"{r.model}/{r.workload_class}/{r.framework}"[:120]
            errs.append(FieldError("rows", f"{where}: out of bounds"))
    return errs


class ProfileView(msgspec.Struct, frozen=True, kw_only=True):
    """One line of ``mosaic profiles`` (``GET /v1/profiles``). ``source``: measured (shipped
    from published benchmarks), learnt (from this cluster's completed jobs), estimated (from
    datasheets: no measurement exists), or learning (observations so far, not yet counted);
    ``detail`` says from what."""

    model: str
    workload_class: str
    framework: str
    speed: float
    power_w: float
    samples: int
    source: str
    detail: str = ""


class ProfilesListing(msgspec.Struct, frozen=True, kw_only=True):
    version: int  # the profiler's table version (0: nothing learnt yet)
    rows: tuple[ProfileView, ...] = ()
