"""The interference model: how much slower a job runs while others share its GPU (issue 16).

``slowdown(a, b)`` is the factor by which a job of workload class ``a`` runs slower beside one
of class ``b`` on the same GPU (its runtime x factor; 1.0 = no interference). Measured pairs
come from ``data/interference.json`` (Lucid's co-location measurements and Gavel's pairwise
space-sharing throughputs, ``libs.policy_io.derive_interference``). The data is NOT symmetric:
an RNN beside a CNN loses 5%, a CNN beside an RNN 14% (the data's figures), so the pair is
ordered.

Pairs nobody measured are ESTIMATED, never refused (any job, any class). The rule, first match:

1. ``row``: A's class has measured pairs: the mean of A's row (how sensitive A is to sharing);
2. ``column``: B's class has measured pairs: the mean of B's column (how much B slows others);
3. ``all``: the mean of every measured pair.

So an inference replica (no source measured inference) beside a CNN takes the CNN column's
mean, and a class the file never heard of beside another takes the mean of all pairs.

Several residents: their excess slowdowns add, ``1 + sum(slowdown(a, b_i) - 1)`` (the sources
measured pairs only; adding the excesses is the simplest rule that grows with every extra
neighbour, and it is more cautious than taking the worst neighbour alone).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType

from proto.jobs import WORKLOAD_CLASSES

DATA_FILE = Path(__file__).with_name("data") / "interference.json"
MEASURED, ROW, COLUMN, ALL = "measured", "row", "column", "all"


@dataclass(frozen=True, slots=True)
class InterferenceModel:
    """Slowdown per ordered (class of the job, class of its neighbour); see the module.

    Immutable: every pair of known classes is answered once when the model is built
    (``table``); a class outside ``proto.jobs.WORKLOAD_CLASSES`` and the data is estimated
    on each ask (rare: the class is validated at the edges)."""

    measured: Mapping[tuple[str, str], float]
    table: Mapping[tuple[str, str], tuple[float, str]]

    @classmethod
    def from_pairs(cls, pairs: Mapping[tuple[str, str], float]) -> InterferenceModel:
        bad = {k: v for k, v in pairs.items() if not v >= 1.0}
        if bad:
            raise ValueError(f"interference: slowdowns must be >= 1, got {bad}")
        measured = MappingProxyType(dict(pairs))
        classes = sorted({*WORKLOAD_CLASSES, *(c for pair in pairs for c in pair)})
        table = {(a, b): _estimate(measured, a, b) for a in classes for b in classes}
        return cls(measured, MappingProxyType(table))

    @classmethod
    def load(cls, path: Path = DATA_FILE) -> InterferenceModel:
        data = json.loads(path.read_text())
        pairs = {}
        for key, entry in data["pairs"].items():
            a, b = key.split("|")
            pairs[(a, b)] = float(entry["slowdown"])
        return cls.from_pairs(pairs)

    @staticmethod
    def default() -> InterferenceModel:
        """The model shipped with the code (``data/interference.json``), read once."""
        return _default()

    def estimate(self, a: str, b: str) -> tuple[float, str]:
        """(slowdown of ``a`` beside ``b``, which rule gave it: measured | row | column | all)."""
        hit = self.table.get((a, b))
        return hit if hit is not None else _estimate(self.measured, a, b)

    def slowdown(self, a: str, b: str) -> float:
        return self.estimate(a, b)[0]

    def slowdown_among(self, a: str, neighbours: Iterable[str]) -> float:
        """Slowdown of ``a`` beside all of ``neighbours`` at once (excesses add)."""
        return 1.0 + sum(self.slowdown(a, b) - 1.0 for b in neighbours)


def _estimate(measured: Mapping[tuple[str, str], float], a: str, b: str) -> tuple[float, str]:
    """The rule of the module docstring, first match."""
    if (a, b) in measured:
        return measured[(a, b)], MEASURED
    row = [v for (x, _), v in measured.items() if x == a]
    if row:
        return sum(row) / len(row), ROW
    col = [v for (_, y), v in measured.items() if y == b]
    if col:
        return sum(col) / len(col), COLUMN
    every = list(measured.values())
    return (sum(every) / len(every) if every else 1.0), ALL


@cache
def _default() -> InterferenceModel:
    """Read once: the model is immutable, so sharing it keeps no mutable module state."""
    return InterferenceModel.load()
