"""The calibration split is by time: every train job is submitted before every holdout job."""

from __future__ import annotations

import pytest

from libs.calibrate.split import split_by_time
from libs.sim.loaders import load_trace
from libs.sim.trace import Trace


def _submits(trace: Trace, window: tuple[float | None, float | None]) -> list[float]:
    lo, hi = window
    return [
        j.submit_s
        for j in trace.jobs
        if (lo is None or j.submit_s >= lo) and (hi is None or j.submit_s < hi)
    ]


@pytest.mark.parametrize("frac", [0.1, 0.3, 0.5])
def test_the_holdout_is_the_later_jobs(frac: float) -> None:
    tr = load_trace("synthetic:200", seed=3)
    split = split_by_time(tr, frac)
    train, held = _submits(tr, split.window("train")), _submits(tr, split.window("holdout"))
    assert max(train) < min(held) == split.cut_s
    assert (len(train), len(held)) == (split.train_jobs, split.holdout_jobs)
    assert len(train) + len(held) == len(tr.jobs)
    assert abs(len(held) - frac * len(tr.jobs)) <= 1


def test_the_replayed_holdout_is_rebased_and_holds_the_later_jobs() -> None:
    tr = load_trace("synthetic:100", seed=1)
    split = split_by_time(tr, 0.3)
    held = tr.slice(start_s=split.cut_s)
    assert held.jobs[0].submit_s == 0.0 and len(held.jobs) == split.holdout_jobs
    assert [j.spec.id for j in held.jobs] == [j.spec.id for j in tr.jobs[split.train_jobs :]]


def test_jobs_of_one_second_stay_on_one_side() -> None:
    tr = load_trace("synthetic:10", seed=0)
    same = [
        type(j)(spec=j.spec, submit_s=5.0 if i >= 2 else float(i)) for i, j in enumerate(tr.jobs)
    ]
    split = split_by_time(Trace(name="t", jobs=tuple(same)), 0.5)
    assert (split.cut_s, split.train_jobs, split.holdout_jobs) == (5.0, 2, 8)


@pytest.mark.parametrize("frac", [0.0, 1.0, -0.2, 1.5])
def test_a_bad_holdout_frac_is_refused(frac: float) -> None:
    with pytest.raises(ValueError, match="holdout_frac"):
        split_by_time(load_trace("synthetic:20"), frac)
