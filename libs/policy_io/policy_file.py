"""``policy.json``: a ``PolicyConfig`` as a file, for ``--policy-file`` and ``mosaic calibrate``.

Why a file of differences: a calibration changes some coefficients; writing only the fields that
differ from the defaults (nested like ``PolicyConfig.describe()``: ``{"weights_high":
{"deadline": 0.3}, "aging_per_h": 0.04}``) makes the file a readable record of what was changed,
and a default later moved in ``config.py`` still reaches every field the file does not name.
Loading goes through ``libs.policy_io.overrides.apply_values`` (the rules of ``--set``), so an
unknown or mistyped field is an error naming it, never a silently ignored key.

The live services read the file named by ``MOSAIC_POLICY_FILE`` (``mosaic up --policy-file``
sets it for every service it starts) through ``live_policy()``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from libs.policy.config import PolicyConfig
from libs.policy_io.overrides import apply_values

ENV = "MOSAIC_POLICY_FILE"
# the shipped calibration (docs/calibration.md); not the defaults: an operator opts in with
# --policy-file, and the lead decides whether config.py adopts it
CALIBRATED_FILE = Path(__file__).resolve().parents[1] / "policy" / "data" / "calibrated.json"


def _leaves(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted name, value) of every non-record field of dataclass ``obj``."""
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            yield from _leaves(v, prefix + f.name + ".")
        else:
            yield prefix + f.name, v


def flat_values(cfg: PolicyConfig) -> dict[str, Any]:
    """Every leaf field of ``cfg`` by dotted name."""
    return dict(_leaves(cfg))


def policy_diff(cfg: PolicyConfig, base: PolicyConfig | None = None) -> dict[str, Any]:
    """The dotted fields of ``cfg`` that differ from ``base`` (default: the defaults)."""
    ref = flat_values(base or PolicyConfig.default())
    return {k: v for k, v in flat_values(cfg).items() if ref[k] != v}


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """Dotted keys as nested objects (the file's layout)."""
    out: dict[str, Any] = {}
    for key, v in flat.items():
        node = out
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = v
    return out


def flatten(tree: dict[str, Any], where: str, prefix: str = "") -> dict[str, Any]:
    """Nested objects as dotted keys; ``where`` names the file in errors."""
    if not isinstance(tree, dict):
        raise ValueError(f"{where}: {prefix.rstrip('.') or 'the file'} must be a JSON object")
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flatten(v, where, prefix + k + "."))
        else:
            out[prefix + k] = v
    return out


def dump_policy(cfg: PolicyConfig) -> str:
    """``cfg``'s differences from the defaults as the JSON text of a policy file."""
    tuples = [k for k, v in policy_diff(cfg).items() if isinstance(v, tuple)]
    if tuples:  # a table cannot be set from a file (see libs.policy_io.overrides)
        raise ValueError(f"a policy file cannot carry table fields: {tuples}")
    return json.dumps(nest(policy_diff(cfg)), indent=2, sort_keys=True) + "\n"


def parse_policy(text: str, where: str = "policy file") -> PolicyConfig:
    """The defaults with the file's fields set; a clear error naming a bad field."""
    try:
        tree = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not JSON ({exc.msg} at line {exc.lineno})") from None
    return apply_values(flatten(tree, where), where=where)


def load_policy_file(path: Path | str) -> PolicyConfig:
    """The policy of the file at ``path`` (see ``parse_policy``)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ValueError(f"policy file {p}: {exc.strerror or exc}") from None
    return parse_policy(text, where=f"policy file {p}")


def write_policy_file(path: Path | str, cfg: PolicyConfig) -> Path:
    """Write ``cfg`` as a policy file at ``path``."""
    p = Path(path)
    p.write_text(dump_policy(cfg))
    return p


def live_policy() -> PolicyConfig:
    """What a live service runs: the file named by ``MOSAIC_POLICY_FILE``, else the defaults.

    Why the environment: ``mosaic up`` and the deployments already hand every service its
    settings that way; a service given a bad file stops at start with the file's error.
    """
    path = os.environ.get(ENV, "").strip()
    return load_policy_file(path) if path else PolicyConfig.default()
