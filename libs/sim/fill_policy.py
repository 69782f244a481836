"""What the fill experiment's policies share: a ledger (a ``ClusterView``) and one ``place`` call.

FGD's experiment (Weng et al., ATC'23) has no clock: pods arrive one at a time and never leave,
and each is placed at once or fails. A fill policy therefore answers one question per pod,
``choose``: which node and GPU slots, among the nodes where the pod fits now
(``stages.defrag.fits``: GPU share, CPUs, host memory, GPU model), or none. The base class
commits the choice to its ledger; ``learn`` hands it the workload learnt from the pods that
arrived so far (for FGD's measure), at each whole percent of arrived GPU request.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.stages.defrag import fits
from libs.policy.stages.frag import Workload
from proto.jobs import JobSpec
from proto.ledger import Allocation
from proto.nodes import NodeSpec

Choice = tuple[int, tuple[int, ...], float]  # node index, GPU slots, share held on each


def allocation(spec: JobSpec, view: ClusterView, choice: Choice, now: float) -> Allocation:
    """The ledger record of ``spec`` at ``choice`` (a CPU-only pod holds no GPU slot)."""
    node, slots, share = choice
    return Allocation(
        job_id=spec.id,
        node=view.node_ids[node],
        gpu_indices=slots,
        gpu_share=share if slots else 1.0,
        gpu_mem_gb=spec.gpu_mem_gb,
        host_mem_gb=spec.host_mem_gb,
        cpus=spec.cpus,
        time=now,
        spec=spec,
    )


def fractional_slots(view: ClusterView, node: int, share: float) -> np.ndarray:
    """GPU slots of ``node`` with ``share`` free (existing slots only)."""
    return np.flatnonzero((view.gpu_free[node] >= share - EPS) & view.gpu_exists[node])


def lowest_whole(view: ClusterView, node: int, k: int) -> tuple[int, ...]:
    """The ``k`` lowest-numbered fully free GPUs of ``node``."""
    return tuple(int(j) for j in np.flatnonzero(view.gpu_free[node] >= 1.0 - EPS)[:k])


class FillPolicy:
    """Base: the ledger, ``place`` (fit, ``choose``, commit) and counters."""

    name = "fill"

    def attach(self, nodes: Sequence[NodeSpec], *, seed: int, cfg: PolicyConfig) -> None:
        self.view = ClusterView.build(nodes)
        self.cfg = cfg
        self.seed = seed
        self.migrations = 0
        self.migrated_gpus = 0.0

    def learn(self, work: Workload) -> None:
        """The workload learnt from what arrived so far (FGD's target workload)."""
        self.work = work

    def choose(self, spec: JobSpec, fit: np.ndarray) -> Choice | None:
        """Where ``spec`` goes among the nodes ``fit`` allows: each policy's own rule (random,
        bestfit, fgd, mosaic); the base has none, as ``baselines.base.BasePolicy.schedule``."""
        raise NotImplementedError

    def place(self, spec: JobSpec, now: float) -> bool:
        """Place ``spec`` now or refuse it (it then never runs: FGD's failed pod)."""
        fit = fits(spec, self.view, self.cfg)
        if not fit.any():
            return False
        choice = self.choose(spec, fit)
        if choice is None:
            return False
        self.view.allocate(allocation(spec, self.view, choice, now))
        return True

    def allocated_gpus(self) -> float:
        """GPU share held now, summed over every GPU."""
        return float(self.view.gpu_exists.sum() - self.view.gpu_free.sum())

    def stats(self) -> dict[str, float]:
        return {"migrations": self.migrations, "migrated_gpus": self.migrated_gpus}
