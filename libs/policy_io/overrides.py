"""Override ``PolicyConfig`` fields by dotted name: ``--set KEY=VALUE`` and policy files.

Why here and not in the config: the config is a frozen record the live services share; a run
that changes it must say so (``results.json`` records ``overrides``) and must fail loudly on a
typo rather than run the defaults. Dotted names reach nested records (``defrag.enabled``,
``weights_high.deadline``). ``apply_overrides`` parses text by the field's declared type (bool,
int, float, str); ``apply_values`` takes values that already have a type (a policy file's JSON,
a calibration trial) and checks them against the same declared type. Both walk the record the
same way (``_set``), so there is one way to override a config. A field of another type (a tuple)
cannot be set either way.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from libs.policy.config import PolicyConfig

TRUE = ("true", "1", "yes", "on")
FALSE = ("false", "0", "no", "off")


def parse_value(text: str, kind: Any, key: str, where: str = "--set") -> Any:
    """``text`` as a value of type ``kind`` (bool, int, float or str)."""
    t = text.strip()
    if kind is bool:
        if t.lower() in TRUE:
            return True
        if t.lower() in FALSE:
            return False
        raise ValueError(f"{where} {key}: {text!r} is not a bool (true/false)")
    if kind is int:
        try:
            return int(t)
        except ValueError:
            raise ValueError(f"{where} {key}: {text!r} is not an int") from None
    if kind is float:
        try:
            v = float(t)
        except ValueError:
            raise ValueError(f"{where} {key}: {text!r} is not a number") from None
        if math.isnan(v):
            raise ValueError(f"{where} {key}: NaN is not a setting")
        return v
    if kind is str:
        return t
    raise ValueError(f"{where} {key}: a field of type {kind} cannot be set from the command line")


def check_value(value: Any, kind: Any, key: str, where: str) -> Any:
    """``value`` if it is of type ``kind`` (an int is a float; a bool is not an int)."""
    if kind is bool and isinstance(value, bool):
        return value
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        if math.isnan(value):
            raise ValueError(f"{where} {key}: NaN is not a setting")
        return float(value)
    if kind is str and isinstance(value, str):
        return value
    if kind not in (bool, int, float, str):
        raise ValueError(f"{where} {key}: a field of type {kind} cannot be set")
    raise ValueError(f"{where} {key}: {value!r} is not a {kind.__name__}")


Maker = Callable[[Any], Any]  # the field's declared type -> the value to set


def _tree(items: Sequence[tuple[str, Maker]], where: str) -> dict[str, Any]:
    """Dotted keys as a nested dict of makers; a later key wins over an earlier one."""
    root: dict[str, Any] = {}
    for key, make in items:
        parts = key.split(".")
        if not all(parts):
            raise ValueError(f"{where} {key}: empty name in a dotted key")
        node = root
        for part in parts[:-1]:
            nxt = node.get(part)
            if not isinstance(nxt, dict):
                nxt = node[part] = {}
            node = nxt
        node[parts[-1]] = (key, make)
    return root


def _apply(obj: Any, tree: dict[str, Any], where: str, prefix: str = "") -> Any:
    """A copy of dataclass ``obj`` with every field of ``tree`` set in one ``replace`` per
    record: the record's checks see the final values together, so two related fields
    (``low_load`` and ``high_load``) may move in either order."""
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    changes: dict[str, Any] = {}
    for head, sub in tree.items():
        key = sub[0] if isinstance(sub, tuple) else prefix + head
        if head not in names:
            kind_name = type(obj).__name__
            raise ValueError(
                f"{where} {key}: unknown {kind_name} field {head!r}; known: {sorted(names)}"
            )
        cur = getattr(obj, head)
        if isinstance(sub, dict):
            if not dataclasses.is_dataclass(cur):
                raise ValueError(f"{where} {key}: {head!r} is not a record with fields")
            changes[head] = _apply(cur, sub, where, prefix + head + ".")
        elif dataclasses.is_dataclass(cur):
            raise ValueError(f"{where} {key}: {head!r} is a record; name one of its fields")
        else:
            changes[head] = sub[1](hints[head])
    try:
        return dataclasses.replace(obj, **changes) if changes else obj
    except ValueError as exc:  # the record's own checks (``__post_init__``)
        raise ValueError(f"{where}: {exc}") from None


def read_field(cfg: PolicyConfig, key: str) -> Any:
    """The value of dotted field ``key`` of ``cfg``."""
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def apply_overrides(
    pairs: Sequence[str], cfg: PolicyConfig | None = None
) -> tuple[PolicyConfig, dict[str, Any]]:
    """(config with every ``KEY=VALUE`` of ``pairs`` applied, the overrides as set); a key
    given twice takes its last value."""
    items: list[tuple[str, Maker]] = []
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--set wants KEY=VALUE, got {pair!r}")
        items.append((key, lambda k, t=text, n=key: parse_value(t, k, n)))
    out = _apply(cfg or PolicyConfig.default(), _tree(items, "--set"), "--set")
    return out, {key: read_field(out, key) for key, _ in items}


def apply_values(
    values: Mapping[str, Any], cfg: PolicyConfig | None = None, where: str = "policy"
) -> PolicyConfig:
    """``cfg`` (default: the defaults) with each dotted ``KEY: value`` of ``values`` set, each
    checked against the field's declared type; ``where`` names the source in errors (a
    file's path, a trial)."""
    items = [
        (key, lambda k, v=value, n=key: check_value(v, k, n, where))
        for key, value in values.items()
    ]
    return _apply(cfg or PolicyConfig.default(), _tree(items, where), where)
