"""The time split of a calibration: tune on the earlier jobs, report on the later ones.

Why by time and not at random: the field report's claim is "trained on 30 days of logs", i.e.
coefficients fitted to the past and run on the future. A random split would let the search see
every week of the holdout's load pattern; a cut in time does not. The cut is the submit time of
the first holdout job when the jobs are in submit order and the last ``holdout_frac`` of them
are held out: every train job is submitted before every holdout job. By count and not by span,
because public traces are bursty (Philly's first 4,000 jobs span 24 days, 90% of them in the
last four), and a cut at 70% of the span would leave the train part nearly empty.

Each part is replayed on its own (``Trace.slice``: the holdout is re-based to start at 0 on an
empty cluster) with the same ``--load`` scaling, so both parts offer the cluster the same load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from libs.sim.trace import Trace

PARTS = ("train", "holdout")


@dataclass(frozen=True, slots=True)
class Split:
    """The cut (trace seconds) and the jobs on each side. ``window(part)`` is the
    ``[start, end)`` submit window ``run_simulation(window_s=...)`` replays."""

    cut_s: float
    train_jobs: int
    holdout_jobs: int

    def window(self, part: str) -> tuple[float | None, float | None]:
        if part == "train":
            return (None, self.cut_s)
        if part == "holdout":
            return (self.cut_s, None)
        raise ValueError(f"unknown part {part!r}; expected one of {PARTS}")

    def as_dict(self) -> dict[str, float | int]:
        return {
            "cut_s": self.cut_s,
            "train_jobs": self.train_jobs,
            "holdout_jobs": self.holdout_jobs,
        }


def split_by_time(trace: Trace, holdout_frac: float) -> Split:
    """Hold out the last ``holdout_frac`` of ``trace``'s jobs by submit time (at least one job
    on each side). Jobs submitted at the same second stay on the same side."""
    if not (isinstance(holdout_frac, int | float) and 0.0 < holdout_frac < 1.0):
        raise ValueError(f"holdout_frac must be in (0, 1), got {holdout_frac!r}")
    submits = [j.submit_s for j in trace.jobs]
    n = len(submits)
    if n < 2:
        raise ValueError(f"trace {trace.name!r}: a split needs at least 2 jobs, got {n}")
    first = min(max(1, math.ceil(n * (1.0 - holdout_frac))), n - 1)
    cut_s = submits[first]
    train = sum(1 for s in submits if s < cut_s)
    if train == 0:  # every job up to the cut shares its second: move the cut past them
        later = [s for s in submits if s > cut_s]
        if not later:
            raise ValueError(f"trace {trace.name!r}: all jobs share one submit time; no split")
        cut_s = later[0]
        train = sum(1 for s in submits if s < cut_s)
    return Split(cut_s=float(cut_s), train_jobs=train, holdout_jobs=n - train)
