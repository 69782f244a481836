"""Fast paths of the pass, apart from the definitions they compute (``libs.policy.stages``):
compiled loops (numba), one module per stage (``guard``, ``groups``, ``rank``, ``fit``, ``score``,
``power``, ``reserve``; re-exported here, read as ``K.<name>``), and memoised paths (``walk``,
``screen``, ``codes``, ``shapes``, ``epochs``, ``reservations``, ``gang_offers``), each tested
against its definition. They import the definitions, never the other way."""

from libs.policy.fast.compile import compiled
from libs.policy.fast.fit import (
    feasible_nodes,
    fit_one,
    fit_whole,
    largest_free,
    refusal_code,
    screen_shapes,
)
from libs.policy.fast.groups import (
    dead_groups,
    group_rows,
    groups_fit,
    groups_in_order,
    live_rows,
    row_keys,
    too_big,
    unique_small,
    unique_sorted,
)
from libs.policy.fast.guard import codes_from_waits, hold_waits, hold_waits_table, row_codes
from libs.policy.fast.power import power_due, power_resume
from libs.policy.fast.rank import (
    dominant_shares,
    priority_terms,
    rows_ranked_after,
    score_table_rows,
    top_rows,
    urgency_many,
    urgency_of,
)
from libs.policy.fast.reserve import reserve_candidates
from libs.policy.fast.score import score_nodes, size_mix_of_counts

__all__ = [
    "codes_from_waits",
    "compiled",
    "dead_groups",
    "dominant_shares",
    "feasible_nodes",
    "fit_one",
    "fit_whole",
    "group_rows",
    "groups_fit",
    "groups_in_order",
    "hold_waits",
    "hold_waits_table",
    "largest_free",
    "live_rows",
    "power_due",
    "power_resume",
    "priority_terms",
    "refusal_code",
    "reserve_candidates",
    "row_codes",
    "row_keys",
    "rows_ranked_after",
    "score_nodes",
    "score_table_rows",
    "screen_shapes",
    "size_mix_of_counts",
    "too_big",
    "top_rows",
    "unique_small",
    "unique_sorted",
    "urgency_many",
    "urgency_of",
]
