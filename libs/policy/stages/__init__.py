"""The stages of a scheduling pass as readable definitions, in pass order: ``rank`` (priority
terms, order), ``filter``, ``score``, ``pick``, ``guard`` (the slow/energy hold, a filter of
GPU models), ``reserve`` (reserve/backfill), ``preempt`` (empty for now), ``power``. Pure numpy
and Python; they never import ``libs.policy.fast``, whose compiled and memoised paths compute
the same answers and are tested against them. See docs/design-notes.md, "libs/policy: layout
and stages (issue 13)"."""
