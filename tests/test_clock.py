"""The shared Mosaic clock: every process of a deployment must compute the same "now"."""

from __future__ import annotations

import time

import pytest

from libs.clock import Clock


def test_two_processes_with_the_same_env_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    start = time.time() - 10.0
    monkeypatch.setenv("MOSAIC_CLOCK_EPOCH", repr(start))
    monkeypatch.setenv("MOSAIC_CLOCK_FACTOR", "60")
    a, b = Clock.from_env(), Clock.from_env()
    assert abs(a.now() - b.now()) < 60 * 0.5
    # ten wall seconds after the epoch, about ten minutes of Mosaic time have passed
    assert 590 <= a.now() - start <= 700
    assert a.wall_seconds(3600) == 60


def test_factor_without_epoch_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOSAIC_CLOCK_EPOCH", raising=False)
    monkeypatch.setenv("MOSAIC_CLOCK_FACTOR", "60")
    with pytest.raises(ValueError, match="MOSAIC_CLOCK_EPOCH"):
        Clock.from_env()


def test_non_positive_factor_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOSAIC_CLOCK_FACTOR", "0")
    with pytest.raises(ValueError, match="> 0"):
        Clock.from_env()
