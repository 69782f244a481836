"""The day/night calendar (issue 16): which period of the day is in force at a Mosaic time.

Why a calendar in the policy: one cluster runs online inference (latency matters while people
use it, by day) and offline training (throughput matters, mostly by night). The calendar names
two periods, ``day`` (its ``hours``, default 08:00-20:00 local time) and ``night`` (the rest of
the day), and what each changes while it lasts (``Period``): a score added to inference or
training jobs in the rank stage, a share of GPUs kept free for inference jobs only, and a factor
on the placement's speed weight. ``libs.policy.daynight.effective_policy`` turns a config and a
time into the config in force then; both drivers call it at each pass's ``now``.

Times are Mosaic seconds (``libs.clock``; in the simulator, trace time) read as Unix time in
``timezone`` (an IANA name, DST included): trace time 0 is 1970-01-01 00:00 UTC. Two fixed,
named records instead of a list of periods: a policy file and ``--set calendar.day.hours=...``
can name every field, and "night is the rest of the day" cannot leave a gap or an overlap.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

MINUTES_PER_DAY = 24 * 60
_HOURS = re.compile(r"^(\d{2}):(\d{2})-(\d{2}):(\d{2})$")


def parse_hours(text: str, name: str) -> tuple[int, int]:
    """(start, end) minutes of the day of ``"HH:MM-HH:MM"``; end may be 24:00, and an end at
    or before the start wraps past midnight ("20:00-08:00"). ``name`` is the field in errors."""
    m = _HOURS.match(text.strip())
    if m is None:
        raise ValueError(f"{name}: {text!r} is not HH:MM-HH:MM (e.g. 08:00-20:00)")
    h0, m0, h1, m1 = (int(g) for g in m.groups())
    for h, mm in ((h0, m0), (h1, m1)):
        if not (0 <= h <= 24 and 0 <= mm < 60) or (h == 24 and mm):
            raise ValueError(f"{name}: {text!r} has a time outside 00:00-24:00")
    start, end = h0 * 60 + m0, h1 * 60 + m1
    if start == MINUTES_PER_DAY or start % MINUTES_PER_DAY == end % MINUTES_PER_DAY:
        raise ValueError(f"{name}: {text!r} is empty or the whole day (night needs some hours)")
    return start, end % MINUTES_PER_DAY


def _hhmm(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


@dataclass(frozen=True, slots=True)
class Period:
    """What one period changes while it lasts (neutral values change nothing).

    ``inference_boost`` / ``training_boost``: score added to a queued job of that kind in the
    rank stage (fresh scores lie in (0, 1]; 0.5 is what 20 h of aging at 0.025/h adds).
    ``headroom_share``: share of the cluster's GPUs a pass keeps free for inference jobs (a
    training job does not start where it would leave fewer free, awake GPUs), and that the
    power stage keeps awake (``warm_reserve_frac`` at least this). ``speed_weight_factor``:
    multiplies ``w_speed`` (placement onto the fastest GPUs: throughput).
    ``hours``: "HH:MM-HH:MM" local time; for ``night``, empty means the rest of the day."""

    hours: str = ""
    inference_boost: float = 0.0
    training_boost: float = 0.0
    headroom_share: float = 0.0
    speed_weight_factor: float = 1.0

    def check(self, name: str) -> None:
        """Raise naming the field (``calendar.<name>.<field>``) of a bad value."""
        for f in ("inference_boost", "training_boost"):
            if not 0.0 <= getattr(self, f) <= 10.0:
                raise ValueError(f"calendar.{name}.{f} must be in [0, 10], got {getattr(self, f)}")
        if not 0.0 <= self.headroom_share < 1.0:
            raise ValueError(
                f"calendar.{name}.headroom_share must be in [0, 1), got {self.headroom_share}"
            )
        if not 0.0 < self.speed_weight_factor <= 100.0:
            raise ValueError(
                f"calendar.{name}.speed_weight_factor must be in (0, 100], "
                f"got {self.speed_weight_factor}"
            )


def _day() -> Period:
    return Period(hours="08:00-20:00", inference_boost=0.5, headroom_share=0.1)


def _night() -> Period:
    return Period(hours="", training_boost=0.25, speed_weight_factor=1.5)


@dataclass(frozen=True, slots=True)
class CalendarConfig:
    """The day/night calendar (module docstring). Off by default: a replay or a cluster without
    inference keeps every figure it had; ``--set calendar.enabled=true`` or a policy file turns
    it on with the default periods. ``active``: the period an effective config is in ("" in a
    configured one; only ``daynight.effective_policy`` sets it, and only an active period
    changes what a stage decides)."""

    enabled: bool = False
    timezone: str = "UTC"
    day: Period = field(default_factory=_day)
    night: Period = field(default_factory=_night)
    active: str = ""

    def __post_init__(self) -> None:
        start, end = parse_hours(self.day.hours, "calendar.day.hours")
        if self.night.hours:
            n0, n1 = parse_hours(self.night.hours, "calendar.night.hours")
            if (n0, n1) != (end, start):
                raise ValueError(
                    f"calendar.night.hours {self.night.hours!r} must be the rest of the day "
                    f"({_hhmm(end)}-{_hhmm(start)}) or empty"
                )
        self.day.check("day")
        self.night.check("night")
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"calendar.timezone: {self.timezone!r} is not an IANA time zone (e.g. UTC, "
                "Europe/Paris)"
            ) from None
        if self.active not in ("", "day", "night"):
            raise ValueError(f"calendar.active must be '', 'day' or 'night', got {self.active!r}")

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def shift(self) -> Period:
        """What the active period changes now (a neutral ``Period`` when none is active)."""
        if self.active == "day":
            return self.day
        if self.active == "night":
            return self.night
        return _NEUTRAL

    def night_hours(self) -> str:
        """The night's hours as "HH:MM-HH:MM" (the rest of the day)."""
        start, end = parse_hours(self.day.hours, "calendar.day.hours")
        return f"{_hhmm(end)}-{_hhmm(start)}"


_NEUTRAL = Period()


def local_minute(cal: CalendarConfig, time_s: float) -> float:
    """Minutes since local midnight in ``cal.timezone`` at Mosaic time ``time_s``."""
    t = dt.datetime.fromtimestamp(time_s, ZoneInfo(cal.timezone))
    return t.hour * 60 + t.minute + (t.second + t.microsecond / 1e6) / 60.0


def period_at(cal: CalendarConfig, time_s: float) -> str:
    """ "day" or "night" at ``time_s``: day from its start (included) to its end (excluded),
    wrapping past midnight when the end is at or before the start."""
    start, end = parse_hours(cal.day.hours, "calendar.day.hours")
    m = local_minute(cal, time_s)
    inside = start <= m < end if start < end else (m >= start or m < end)
    return "day" if inside else "night"


def next_switch_s(cal: CalendarConfig, time_s: float) -> float:
    """The first Mosaic time after ``time_s`` at which the period changes (a local-time
    boundary of ``day.hours`` on this day or the next two)."""
    zone = ZoneInfo(cal.timezone)
    start, end = parse_hours(cal.day.hours, "calendar.day.hours")
    today = dt.datetime.fromtimestamp(time_s, zone).date()
    best = float("inf")
    for days in range(3):
        date = today + dt.timedelta(days=days)
        for minute in (start, end):
            at = dt.datetime.combine(date, dt.time(), zone) + dt.timedelta(minutes=minute)
            # wall-clock arithmetic in the zone, so a DST change keeps the boundary's hour
            t = dt.datetime(at.year, at.month, at.day, at.hour, at.minute, tzinfo=zone)
            ts = t.timestamp()
            if time_s < ts < best:
                best = ts
    return best
