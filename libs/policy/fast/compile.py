"""Compiled inner loops of the scheduling pass (numba): the steps that are one loop over the
queue's rows or over the feasible nodes.

Why compiled: on a long queue behind a full cluster (thousands of rows), a backfill pass spends
its time in a few dozen numpy calls over those rows (group them, look up their kept slow-model
codes, filter the dead ones) and, per placement, over the feasible nodes (the score terms),
each a few microseconds of fixed cost. One loop does the same work in a fraction of that.

Exactness: the row steps make only integer arithmetic and the same float operations as the
numpy expressions they replace (comparisons, elementwise arithmetic, exact min/max), so their
answers are identical bit for bit. The placement scores also sum, in a fixed order, where
numpy summed pairwise or through BLAS; those totals may differ in the last bits, which is why
a placement treats totals within ``stages.pick.SCORE_TIE`` as a tie. ``tests/policy/
test_kernels.py`` checks each kernel against the numpy expression (or score function) it
replaces.

Compiled code is cached on disk (next to this file, else ``~/.cache/numba``, or where
``NUMBA_CACHE_DIR`` says: the image sets ``/tmp/numba``), so a process compiles only what the
cache lacks. Where no location is writable the functions are compiled per process instead:
the same code, only slower to start.
"""

from __future__ import annotations

from collections.abc import Callable

from numba import njit


def compiled(fn: Callable) -> Callable:
    """``njit`` with the on-disk cache where a location is writable (see the module note)."""
    try:
        return njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available" (read-only)
        return njit(nogil=True)(fn)
