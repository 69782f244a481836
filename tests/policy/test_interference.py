"""The interference model (libs.policy.interference): measured pairs read from the shipped
data, unmeasured pairs estimated by the stated rule, never a failure for an unknown class,
and the data's asymmetry kept."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from libs.policy.interference import ALL, COLUMN, DATA_FILE, MEASURED, ROW, InterferenceModel
from proto.jobs import WORKLOAD_CLASSES

M = InterferenceModel.default()
PAIRS = json.loads(DATA_FILE.read_text())["pairs"]


def test_a_measured_pair_is_the_shipped_figure() -> None:
    got, how = M.estimate("cnn", "rnn")
    assert how == MEASURED
    assert got == PAIRS["cnn|rnn"]["slowdown"]
    assert set(PAIRS["cnn|rnn"]["sources"]) == {"lucid", "gavel"}


def test_the_data_is_not_symmetric_and_the_model_keeps_it() -> None:
    assert M.slowdown("cnn", "rnn") != M.slowdown("rnn", "cnn")


def test_unmeasured_pairs_are_estimated_by_the_rule() -> None:
    # no source measured inference: its row is empty, so the neighbour's column mean
    got, how = M.estimate("inference", "cnn")
    col = [v["slowdown"] for k, v in PAIRS.items() if k.endswith("|cnn")]
    assert how == COLUMN and abs(got - sum(col) / len(col)) < 1e-12
    got, how = M.estimate("cnn", "inference")
    row = [v["slowdown"] for k, v in PAIRS.items() if k.startswith("cnn|")]
    assert how == ROW and abs(got - sum(row) / len(row)) < 1e-12
    got, how = M.estimate("inference", "inference")
    every = [v["slowdown"] for v in PAIRS.values()]
    assert how == ALL and abs(got - sum(every) / len(every)) < 1e-12


@given(st.text(max_size=12), st.text(max_size=12))
def test_any_class_gets_a_finite_slowdown_of_at_least_one(a: str, b: str) -> None:
    assert 1.0 <= M.slowdown(a, b) < 10.0


def test_every_known_class_pair_is_answered_and_neighbours_add() -> None:
    for a in WORKLOAD_CLASSES:
        for b in WORKLOAD_CLASSES:
            assert M.slowdown(a, b) >= 1.0
    two = M.slowdown_among("cnn", ["cnn", "rnn"])
    assert abs(two - (1 + (M.slowdown("cnn", "cnn") - 1) + (M.slowdown("cnn", "rnn") - 1))) < 1e-12
    assert M.slowdown_among("cnn", []) == 1.0


def test_derive_script_reproduces_the_shipped_table(traces_dir) -> None:  # type: ignore[no-untyped-def]
    from libs.policy_io.derive_interference import derive

    assert derive(traces_dir) == json.loads(DATA_FILE.read_text())
