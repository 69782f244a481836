"""The decode limits and size helpers of libs.bus.limits, checked against plain definitions."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.bus.limits import (
    DEAD_LETTER_DATA_MAX,
    DecodeLimits,
    header_size,
    json_depth_exceeds,
    parse_size,
    truncated,
)


def reference_depth(data: bytes) -> int:
    """The nesting a JSON parser reaches: brackets outside strings, byte by byte, until the
    first close that has no open (a parser stops there)."""
    depth = deepest = 0
    in_string = escaped = False
    for b in data:
        c = chr(b)
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
            if depth < 0:
                break
    return deepest


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab[]{}"\\\n é'),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(alphabet='k[]{}"\\', max_size=4), inner, max_size=4)
    ),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(value=json_values, max_depth=st.integers(0, 12))
def test_depth_of_valid_json_is_exact(value: object, max_depth: int) -> None:
    data = msgspec.json.encode(value)
    assert json_depth_exceeds(data, max_depth) == (reference_depth(data) > max_depth)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200) | st.text('[]{}"\\a,:').map(str.encode), k=st.integers(0, 8))
def test_depth_is_never_underestimated_on_garbage(data: bytes, k: int) -> None:
    # malformed input may be over-counted (it does not decode anyway), never under-counted
    if reference_depth(data) > k:
        assert json_depth_exceeds(data, k)


def test_depth_examples() -> None:
    assert not json_depth_exceeds(b'{"a": [1, {"b": "[[[[[[[[[["}]}', 3)
    assert json_depth_exceeds(b'{"a": [1, {"b": [[]]}]}', 3)
    assert json_depth_exceeds(b"[" * 100_000, 64)  # the message that once ended six loops
    nested = b'{"a":' * 2000 + b"1" + b"}" * 2000
    assert json_depth_exceeds(nested, 64)
    assert not json_depth_exceeds(b"", 1)


def test_limits_problem_kinds_and_env() -> None:
    limits = DecodeLimits(max_bytes=100, max_depth=2)
    assert limits.problem(b"[[1]]") is None
    assert limits.problem(b"[[[1]]]") == ("too_deep", "too deep: JSON nested more than 2 levels")
    kind, reason = limits.problem(b" " * 101) or ("", "")
    assert kind == "too_large" and "101 bytes > limit 100" in reason
    env = {"MOSAIC_BUS_MAX_MESSAGE_BYTES": "2MiB", "MOSAIC_BUS_MAX_JSON_DEPTH": "9"}
    assert DecodeLimits.from_env(env) == DecodeLimits(max_bytes=2 * 1024 * 1024, max_depth=9)
    assert DecodeLimits.from_env({}) == DecodeLimits()
    with pytest.raises(ValueError):
        DecodeLimits(max_bytes=0)


def test_parse_size() -> None:
    assert parse_size("1048576") == 1048576
    assert parse_size("512KiB") == 512 * 1024
    assert parse_size("256 MiB") == 256 * 1024**2
    assert parse_size("2G") == 2 * 1024**3
    assert parse_size("-1") == -1
    for bad in ("", "1.5GiB", "12 parsecs", "MiB"):
        with pytest.raises(ValueError, match="not a size"):
            parse_size(bad)


def test_header_size_and_truncation() -> None:
    assert header_size(None) == 0 and header_size({}) == 0
    # NATS/1.0\r\n + "Nats-Msg-Id: j1\r\n" + \r\n
    assert header_size({"Nats-Msg-Id": "j1"}) == 10 + len("Nats-Msg-Id: j1\r\n") + 2
    assert truncated(b"abc") == (b"abc", "")
    big = b"x" * (DEAD_LETTER_DATA_MAX + 5)
    kept, note = truncated(big)
    assert kept == big[:DEAD_LETTER_DATA_MAX] and str(len(big)) in note
