"""Reading the trace files: gzip-aware CSV with the header checked, so a wrong file fails loudly."""

from __future__ import annotations

import csv
import gzip
import io
from pathlib import Path


def open_text(path: Path) -> io.TextIOBase:
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")  # the caller closes it


def read_csv(path: Path, required: tuple[str, ...]) -> tuple[dict[str, int], list[list[str]]]:
    """(column index by name, data rows). Raises ValueError naming missing columns."""
    with open_text(path) as f:
        reader = csv.reader(f)
        try:
            header = next(reader)
        except StopIteration:
            want = ", ".join(required)
            raise ValueError(f"{path}: empty file, expected columns {want}") from None
        rows = [r for r in reader if r]
    cols = {name.strip(): i for i, name in enumerate(header)}
    missing = [c for c in required if c not in cols]
    if missing:
        raise ValueError(
            f"{path}: missing column(s) {', '.join(missing)}; header is {', '.join(header)}"
        )
    width = len(header)
    for k, r in enumerate(rows):
        if len(r) != width:
            raise ValueError(f"{path}: row {k + 2} has {len(r)} fields, header has {width}")
    return cols, rows


def column(rows: list[list[str]], idx: int) -> list[str]:
    return [r[idx] for r in rows]
