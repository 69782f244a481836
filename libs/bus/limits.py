"""Limits checked on raw bytes before a decoder or the NATS server sees them.

Why before msgspec: msgspec decodes nested JSON recursively, so a 6 KB message nested a few
thousand levels deep raises ``RecursionError`` (not a ``DecodeError``) — it once ended every
consumer loop of a service. A cheap scan of the brackets bounds the nesting first, and a size cap
bounds the work, so a hostile or broken publisher costs one dead letter, never a loop.

Why before publishing: nats-py checks only the data against the server's ``max_payload``; data
plus headers over it makes the server answer ``-ERR 'Maximum Payload Violation'`` and drop the
connection. ``payload_size`` is what the server counts, so the bus can refuse at the edge.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024  # nats-server's default max_payload (1 MiB)
DEFAULT_MAX_JSON_DEPTH = 64  # the deepest proto message nests < 10 levels
# what a dead letter keeps of a rejected message: enough to debug it, small enough that the
# letter itself (base64, 4/3 larger) always fits the server's max payload
DEAD_LETTER_DATA_MAX = 64 * 1024
DEAD_LETTER_REASON_MAX = 2000  # characters; a handler's exception text can be anything
# headers nats-py or JetStream may add beyond ours; what publish keeps free under max_payload
PAYLOAD_MARGIN_BYTES = 512

ENV_MAX_MESSAGE_BYTES = "MOSAIC_BUS_MAX_MESSAGE_BYTES"
ENV_MAX_JSON_DEPTH = "MOSAIC_BUS_MAX_JSON_DEPTH"

# a JSON string: quote, then runs of plain characters or escapes, then quote (unrolled so the
# regex engine does not backtrack per character)
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_OPEN_TO_SQUARE = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "m": 1024**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gib": 1024**3,
}
_SIZE = re.compile(r"^\s*(-?\d+)\s*([a-zA-Z]*)\s*$")


def json_depth_exceeds(data: bytes, max_depth: int) -> bool:
    """True when ``data`` nests arrays/objects more than ``max_depth`` deep (brackets inside
    strings do not count). Conservative on malformed input: an unclosed bracket counts as a
    level, an unterminated string's brackets count too — such input does not decode anyway.

    Cost: brackets are counted first; a message with at most ``max_depth`` of them cannot be
    too deep (most messages stop there). Otherwise strings are cut out and the innermost
    ``[]`` pairs removed once per level, all in C, at most ``max_depth`` + 1 passes.
    """
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return False
    brackets = _STRING.sub(b"", data).translate(_OPEN_TO_SQUARE, _NOT_BRACKETS)
    levels = 0
    while brackets:
        shorter = brackets.replace(b"[]", b"")
        if len(shorter) == len(brackets):
            break  # only unmatched brackets left: "]]][[[" — each open one is a level
        levels += 1
        if levels > max_depth:
            return True
        brackets = shorter
    return levels + brackets.count(b"[") > max_depth


@dataclass(frozen=True)
class DecodeLimits:
    """What a received message may be before it is decoded; see the module docstring."""

    max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_depth: int = DEFAULT_MAX_JSON_DEPTH

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.max_depth < 1:
            raise ValueError(f"decode limits must be >= 1, got {self}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DecodeLimits:
        """The defaults, overridden by ``MOSAIC_BUS_MAX_MESSAGE_BYTES`` (a size such as
        ``4MiB``) and ``MOSAIC_BUS_MAX_JSON_DEPTH``."""
        env = os.environ if env is None else env
        max_bytes = env.get(ENV_MAX_MESSAGE_BYTES)
        max_depth = env.get(ENV_MAX_JSON_DEPTH)
        return cls(
            max_bytes=parse_size(max_bytes) if max_bytes else DEFAULT_MAX_MESSAGE_BYTES,
            max_depth=int(max_depth) if max_depth else DEFAULT_MAX_JSON_DEPTH,
        )

    def problem(self, data: bytes) -> tuple[str, str] | None:
        """(kind, reason) when ``data`` is over a limit, else None."""
        if len(data) > self.max_bytes:
            return "too_large", f"too large: {len(data)} bytes > limit {self.max_bytes}"
        if json_depth_exceeds(data, self.max_depth):
            return "too_deep", f"too deep: JSON nested more than {self.max_depth} levels"
        return None


def parse_size(text: str) -> int:
    """``"256MiB"`` → 268435456; plain integers are bytes; K/M/G are binary (KiB, MiB, GiB).
    ``-1`` means unlimited where the caller allows it."""
    m = _SIZE.match(text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use e.g. 1048576, 512KiB, 256MiB, 2GiB)")
    n = int(m.group(1))
    return n if n < 0 else n * _UNITS[m.group(2).lower()]


def header_size(headers: Mapping[str, str] | None) -> int:
    """Bytes the headers take on the wire (``NATS/1.0`` block), as the server counts them
    against ``max_payload``."""
    if not headers:
        return 0
    size = len(b"NATS/1.0\r\n") + 2
    for k, v in headers.items():
        size += len(k.encode()) + 2 + len(v.encode()) + 2
    return size


def truncated(data: bytes) -> tuple[bytes, str]:
    """(what a dead letter keeps of ``data``, a note for its reason when that is not all)."""
    if len(data) <= DEAD_LETTER_DATA_MAX:
        return data, ""
    return data[:DEAD_LETTER_DATA_MAX], f" (data cut to {DEAD_LETTER_DATA_MAX} of {len(data)} B)"
