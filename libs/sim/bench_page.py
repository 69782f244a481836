"""The benchmark page's sections that a scenario owns (``bench_gavel``, ``bench_peers``): each
sits between its own start and end markers below the page's keep marker, so the scenario's
command replaces only its section and ``make bench`` keeps the rest."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "benchmarks.md"


def write_between(text: str, start: str, end: str, doc: Path = DOC) -> None:
    """Replace the section between ``start`` and ``end`` with ``text`` (or append it)."""
    page = doc.read_text() if doc.is_file() else "# Benchmarks\n"
    a, b = page.find(start), page.find(end)
    if a >= 0 and b > a:
        page = page[:a] + text.rstrip("\n") + page[b + len(end) :]
    else:
        page = page.rstrip("\n") + "\n\n" + text
    doc.write_text(page if page.endswith("\n") else page + "\n")


def shown(path: Path) -> Path:
    """A folder as the page shows it: relative to the checkout when inside it."""
    try:
        return path.resolve().relative_to(ROOT)
    except ValueError:
        return path
