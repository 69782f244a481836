"""Where a service replica goes among the nodes that fit it (issue 16): fast enough, packed.

Why a rule of its own: a replica never ends (the scaler stops it), so where it lands stays
taken for as long as the service is busy, and the usual pick (the fastest, greenest node;
the packing term reads the queue's size mix, which a burst of quarter-GPU replicas fills with
quarters) spreads a service over many nodes. Measured (Philly 500, seed cluster, the issue-16
service, seed 1): while an 8-GPU job waited, 61 replicas on average touched 8.1 nodes (7.9 of
the 13 A100 nodes) where 3 would hold them, no A100 node was whole, and the 23 8-GPU jobs'
mean wait grew from 86 h to 295 h, 71% of the training JCT the service cost. A short
fractional pod's spread heals as it ends; a replica's does not.

The rule (``replica_key``), per feasible node, smallest first:

1. **too slow**: 0 where the node's GPU model meets the replica's latency target alone
   (``solo_latency_p99_ms / speed <= latency_p99_ms``, speed relative to the reference GPU,
   the simulator's latency model); a replica without both figures finds every model fast
   enough (its ``constraints`` say where it may go);
2. **heat**: 1 on a node ``stages.heat`` keeps a stuck job off (as the score does);
3. **opens a GPU**: 0 where the node has a GPU already holding fractions the replica may join
   (by share, memory and ``stages.share``'s mask), so fractions stack before a whole GPU is cut;
4. **whole free GPUs** on the node, fewest first (node-level best fit), so whole nodes stay
   whole for wide training;
5. minus the placement score (speed, energy, packing, ...), then the node's position.

Scope: replicas of a service (``JobSpec.service``) that are fractional. Other fractional jobs
(openb's pods, the fill experiment) keep the scored pick: their figures do not move.
``replica_pick`` is the vectorised form ``placement.place`` calls, checked against
``replica_key`` in ``tests/policy/test_pack.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from libs.policy.cluster import EPS
from proto.jobs import JobSpec


def applies(spec: JobSpec) -> bool:
    """The rule is for fractional service replicas only (module docstring)."""
    return bool(spec.service) and spec.gpus < 1.0 - EPS


def fast_enough(spec: JobSpec, speed: np.ndarray) -> np.ndarray:
    """bool per node: its model's speed (relative to the reference GPU, for the replica's
    class) keeps the replica's solo p99 within its target."""
    solo, target = spec.solo_latency_p99_ms, spec.latency_p99_ms
    if not solo or target is None:
        return np.ones(len(speed), dtype=bool)
    return solo / np.maximum(speed, EPS) <= target + EPS


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the rule reads of one feasible node."""

    fast: bool  # its GPU model meets the latency target alone
    risky: bool  # stages.heat keeps the replica off it
    joins: bool  # it has a GPU holding fractions the replica may join
    whole_free: int  # its fully free GPUs
    score: float  # the placement total


def replica_key(n: NodeFacts, position: int) -> tuple:
    """The definition: the feasible node with the smallest key takes the replica."""
    return (not n.fast, n.risky, not n.joins, n.whole_free, -n.score, position)


def joinable(spec: JobSpec, free: np.ndarray, mem_free: np.ndarray) -> np.ndarray:
    """bool per node (rows of ``free``: share free per GPU, masked by ``stages.share``): some
    GPU already holds fractions (0 < free < 1) and has room for the replica."""
    partial = (free > EPS) & (free < 1.0 - EPS)
    room = (free >= spec.gpus - EPS) & (mem_free >= spec.gpu_mem_gb - EPS)
    return (partial & room).any(axis=1)


def replica_pick(
    fast: np.ndarray,
    risky: np.ndarray,
    joins: np.ndarray,
    whole_free: np.ndarray,
    total: np.ndarray,
) -> int:
    """The position of the node ``replica_key`` puts first (np.lexsort: last key primary)."""
    pos = np.arange(len(total))
    order = np.lexsort((pos, -total, whole_free, ~joins, risky, ~fast))
    return int(order[0])
