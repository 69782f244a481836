"""Parsing of the Slurm-like flags of ``mosaic submit``: sizes, durations, elastic ranges, lists.

Why a module of its own: these are the only places a user types free text, so each parser
refuses bad input with a message that names what was expected, and is unit-tested alone.
"""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)[bB]?\s*$")
_SIZE_TO_GB = {"": 1.0, "k": 1 / 1024**2, "m": 1 / 1024, "g": 1.0, "t": 1024.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_DURATION_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
# an absolute deadline is a unix time: anything this large cannot be a relative duration
_ABSOLUTE_AFTER_S = 1_000_000_000


def parse_mem_gb(text: str) -> float:
    """``128G`` -> 128.0, ``512M`` -> 0.5, ``1T`` -> 1024.0, ``64`` -> 64.0 (GB when no unit)."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"memory {text!r}: expected a number with an optional K/M/G/T unit")
    return float(m.group(1)) * _SIZE_TO_GB[m.group(2).lower()]


def parse_duration_s(text: str) -> float:
    """``30m`` -> 1800, ``2h`` -> 7200, ``1d12h`` -> 129600, ``90`` -> 90 (seconds)."""
    t = text.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", t):
        return float(t)
    if not t or _DURATION.sub("", t).strip():
        raise ValueError(f"duration {text!r}: expected e.g. 90, 30m, 2h, 1d or 1h30m")
    total = sum(float(n) * _DURATION_S[u] for n, u in _DURATION.findall(t))
    if total <= 0:
        raise ValueError(f"duration {text!r} must be > 0")
    return total


def parse_deadline(text: str, now: float) -> float:
    """A deadline as unix seconds on the Mosaic clock: a duration counts from ``now``; a plain
    number above 10^9 is already an absolute unix time."""
    t = text.strip()
    try:
        value = float(t)
    except ValueError:
        return now + parse_duration_s(t)
    if value >= _ABSOLUTE_AFTER_S:
        return value
    return now + parse_duration_s(t)


def parse_elastic(text: str) -> tuple[int, int]:
    """``2:8`` -> (2, 8)."""
    m = re.fullmatch(r"\s*(\d+)\s*[:\-]\s*(\d+)\s*", text)
    if not m:
        raise ValueError(f"elastic {text!r}: expected MIN:MAX GPUs, e.g. 2:8")
    lo, hi = int(m.group(1)), int(m.group(2))
    if lo < 1 or hi < lo:
        raise ValueError(f"elastic {text!r}: needs 1 <= MIN <= MAX")
    return lo, hi


def parse_list(values: list[str] | None) -> tuple[str, ...]:
    """Repeated flags and comma lists alike: ``-c a100 -c v100,t4`` -> (a100, v100, t4)."""
    out: list[str] = []
    for v in values or []:
        out.extend(p.strip() for p in v.split(",") if p.strip())
    return tuple(dict.fromkeys(out))
