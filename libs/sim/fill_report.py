"""Summaries of fill runs (``python -m libs.sim.fill_report DIR ...``): the mean and spread over
seeds of each policy's allocation ratio at chosen arrived percentages, as a Markdown table.

Each DIR holds one ``results.json`` of ``mosaic sim --fill`` (one seed).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def summarise(results: Sequence[dict], points: Sequence[str] = ("100", "130")) -> dict:
    """policy -> {point: (mean, min, max)} plus the mean migrations and failed pods."""
    out: dict[str, dict] = {}
    names = list(results[0]["policies"])
    for name in names:
        runs = [r["policies"][name] for r in results if name in r["policies"]]
        row: dict = {}
        for p in points:
            vals = np.array([m["alloc_at_arrived"][p] for m in runs])
            row[p] = (float(vals.mean()), float(vals.min()), float(vals.max()))
        row["migrations"] = float(np.mean([m["migrations"] for m in runs]))
        row["pods_failed"] = float(np.mean([m["pods_failed"] for m in runs]))
        row["runs"] = len(runs)
        out[name] = row
    return out


def markdown(summary: dict, points: Sequence[str] = ("100", "130")) -> str:
    head = "| policy | " + " | ".join(f"alloc @{p}% (min-max)" for p in points)
    head += " | failed pods | migrations | seeds |"
    lines = [head, "|" + "---|" * (len(points) + 4)]
    for name, row in summary.items():
        cells = [f"{row[p][0]:.2%} ({row[p][1]:.2%}-{row[p][2]:.2%})" for p in points]
        extra = f"{row['pods_failed']:.0f} | {row['migrations']:.1f} | {row['runs']}"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {extra} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    dirs = [Path(a) for a in (argv if argv is not None else sys.argv[1:])]
    if not dirs:
        print("usage: python -m libs.sim.fill_report DIR [DIR ...]", file=sys.stderr)
        return 2
    results = [json.loads((d / "results.json").read_text()) for d in dirs]
    seeds = sorted(r["seed"] for r in results)
    print(f"{results[0]['trace']}, seeds {seeds}")
    print(markdown(summarise(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
