"""``mosaic sim --set KEY=VALUE``: override any ``PolicyConfig`` field for one run.

Why here and not in the config: the config is a frozen record the live services share; a run
that changes it must say so (``results.json`` records ``overrides``) and must fail loudly on a
typo rather than run the defaults. Dotted names reach nested records (``defrag.enabled``,
``weights_high.deadline``); the value is parsed by the field's declared type (bool, int, float,
str); a field of another type (a tuple) cannot be set from the command line.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Sequence
from typing import Any

from libs.policy.config import PolicyConfig

TRUE = ("true", "1", "yes", "on")
FALSE = ("false", "0", "no", "off")


def parse_value(text: str, kind: Any, key: str) -> Any:
    """``text`` as a value of type ``kind`` (bool, int, float or str)."""
    t = text.strip()
    if kind is bool:
        if t.lower() in TRUE:
            return True
        if t.lower() in FALSE:
            return False
        raise ValueError(f"--set {key}: {text!r} is not a bool (true/false)")
    if kind is int:
        try:
            return int(t)
        except ValueError:
            raise ValueError(f"--set {key}: {text!r} is not an int") from None
    if kind is float:
        try:
            v = float(t)
        except ValueError:
            raise ValueError(f"--set {key}: {text!r} is not a number") from None
        if math.isnan(v):
            raise ValueError(f"--set {key}: NaN is not a setting")
        return v
    if kind is str:
        return t
    raise ValueError(f"--set {key}: a field of type {kind} cannot be set from the command line")


def _set(obj: Any, path: list[str], text: str, key: str) -> Any:
    """A copy of dataclass ``obj`` with the field at ``path`` set from ``text``."""
    names = {f.name for f in dataclasses.fields(obj)}
    head = path[0]
    if head not in names:
        where = type(obj).__name__
        raise ValueError(f"--set {key}: unknown {where} field {head!r}; known: {sorted(names)}")
    kind = typing.get_type_hints(type(obj))[head]
    cur = getattr(obj, head)
    if len(path) > 1:
        if not dataclasses.is_dataclass(cur):
            raise ValueError(f"--set {key}: {head!r} is not a record with fields")
        return dataclasses.replace(obj, **{head: _set(cur, path[1:], text, key)})
    if dataclasses.is_dataclass(cur):
        raise ValueError(f"--set {key}: {head!r} is a record; name one of its fields")
    return dataclasses.replace(obj, **{head: parse_value(text, kind, key)})


def apply_overrides(
    pairs: Sequence[str], cfg: PolicyConfig | None = None
) -> tuple[PolicyConfig, dict[str, Any]]:
    """(config with every ``KEY=VALUE`` of ``pairs`` applied in order, the overrides as set)."""
    out = cfg or PolicyConfig.default()
    done: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--set wants KEY=VALUE, got {pair!r}")
        out = _set(out, key.split("."), text, key)
        node: Any = out
        for part in key.split("."):
            node = getattr(node, part)
        done[key] = node
    return out, done
