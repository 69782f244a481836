"""Which running jobs the guard asks to move: the caller's predicate of the guard's definition.

Why here and not in the guard: the rule is the placer's (``libs.policy.stages.preempt``: it
commits or refuses every move against its own rule). The guard asks only for moves that rule
could allow, so a refusal is news, not routine: a job that is neither checkpointable nor
elastic, or an inference job, stays where it is (issue 14: never preempt those).
"""

from __future__ import annotations

from proto.jobs import JobSpec


def may_move(spec: JobSpec | None) -> bool:
    """A training job that can keep its progress when stopped: checkpointable or elastic. An
    allocation without its spec (an older ledger entry) is not moved: nothing says it may."""
    if spec is None or spec.kind == "inference" or spec.workload_class == "inference":
        return False
    return spec.checkpointable or spec.elastic is not None
