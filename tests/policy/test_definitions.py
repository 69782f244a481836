"""Fast paths against the definitions they compute (``libs.policy.stages``), where
``test_kernels.py`` does not already compare them: the urgency term and the pick of a node."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.policy import fast as K
from libs.policy.config import PolicyConfig
from libs.policy.priority import urgency
from libs.policy.stages import pick as pick_def
from libs.policy.stages import rank as rank_def

CFG = PolicyConfig()
F = st.floats(-1e7, 1e7, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), F), F), min_size=0, max_size=30), F)
def test_urgency_is_its_definition(rows, now):
    deadline = np.array([np.nan if d is None else d for d, _ in rows], dtype=float)
    remaining = np.array([abs(r) for _, r in rows], dtype=float)
    got = urgency(deadline, now, remaining, CFG)
    want = rank_def.urgency(deadline, now, remaining, CFG.urgency_scale_s, CFG.urgency_missed)
    assert got.tobytes() == want.tobytes()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.1, 0.5, 0.5 + 1e-10, 0.5 - 1e-10, 0.9, np.nan]), min_size=1))
def test_the_compiled_pick_is_the_definition(totals):
    """``fast.score_nodes``'s choice among its totals is ``stages.pick.pick`` of them (a
    speed-only score: near-ties, NaN totals)."""
    speeds = np.array(totals, dtype=float)
    n = len(speeds)
    total, _, _, best = K.score_nodes(
        np.arange(n), np.ones((n, 1)), np.full((n, 1), 80.0), np.full(n, 80.0),
        np.arange(n, dtype=np.int64), np.full(n, np.nan), False, speeds[:, None],
        np.ones((n, 1)), 0, False, 1, 1.0, 8.0, np.array([1.0]), np.array([1.0]),
        np.array([1.0, 0.0, 0.0, 0.0, 0.0]), 1.0, 85.0, 55.0, 1e-9, pick_def.SCORE_TIE,
    )  # fmt: skip
    assert best == pick_def.pick(total)
