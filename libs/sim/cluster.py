"""The simulator's own ledger of the cluster: per-GPU free share and memory, per-node host memory
and CPUs, as numpy arrays.

Why a second ledger beside ``libs.policy``'s ``ClusterView``: the simulator must check every
assignment a policy makes (never over-allocate, detect OOM when memory was not checked) without
trusting the policy's own bookkeeping, and the baselines need a fast first fit that does not
depend on Mosaic's placement code. The policy view, when a policy asks for one, is kept in step
here (``allocate``/``release`` in place, never rebuilt per event).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

import numpy as np

from libs.policy.fast.compile import compiled
from proto.gpus import matches
from proto.jobs import JobSpec
from proto.ledger import Allocation
from proto.nodes import NodeSpec

EPS = 1e-9


class OverAllocation(AssertionError):
    """A policy asked for resources that are not free: a bug in the policy or the engine."""


class SimCluster:
    """Free resources of every node; ``allocate``/``release`` mutate in place."""

    def __init__(self, nodes: Sequence[NodeSpec]):
        if not nodes:
            raise ValueError("empty cluster")
        self.nodes = list(nodes)
        self.index = {n.id: i for i, n in enumerate(self.nodes)}
        if len(self.index) != len(self.nodes):
            raise ValueError("node ids are not unique")
        width = max(n.gpu_count for n in self.nodes)
        self.gpu_count = np.array([n.gpu_count for n in self.nodes], dtype=np.int64)
        self.gpu_mem_gb = np.array([n.gpu_mem_gb for n in self.nodes], dtype=float)
        self.host_mem_gb = np.array([n.host_mem_gb for n in self.nodes], dtype=float)
        self.cpus = np.array([n.cpus for n in self.nodes], dtype=float)
        self.models = sorted({n.gpu_model for n in self.nodes})
        self.model_index = np.array([self.models.index(n.gpu_model) for n in self.nodes])
        # Slots beyond a node's gpu_count are permanently "used" (share 0 free).
        valid = np.arange(width)[None, :] < self.gpu_count[:, None]
        self.free_share = np.where(valid, 1.0, 0.0)
        self.mem_used_gb = np.zeros((len(self.nodes), width))
        self.host_free_gb = self.host_mem_gb.copy()
        self.cpus_free = self.cpus.copy()
        self.capacity_gpus = float(self.gpu_count.sum())
        self.allocated_gpus = 0.0
        self._whole_free = self.gpu_count.copy()  # whole free GPUs per node, kept in step
        self._mask_cache: dict[tuple[str, ...], np.ndarray] = {}
        self._ever: dict[tuple, bool] = {}  # could_ever_fit per request shape
        self._tiers = np.unique(self.gpu_mem_gb)  # distinct GPU memory sizes, ascending
        self._tier_list = [float(m) for m in self._tiers]
        self._widest: dict[tuple[str, ...], int] = {}
        self._version = 0
        self._tier_cache: tuple | None = None
        self.policy_view = None  # a libs.policy ClusterView, when a policy needs one
        self._view_hooks: list[Callable[[str, Allocation], None]] = []
        self._tiers_now()  # computed (and its compiled loop loaded) before the run starts

    # ----- bookkeeping ---------------------------------------------------------------------
    def add_hook(self, hook: Callable[[str, Allocation], None]) -> None:
        """``hook("allocate"|"release", alloc)`` after each change (keeps a policy view in step)."""
        self._view_hooks.append(hook)

    def allocate(self, alloc: Allocation, notify: bool = True) -> bool:
        """Commit ``alloc``. Returns whether its GPU memory fits (False = the job will OOM).

        Raises ``OverAllocation`` when GPU share, host memory or CPUs are not free. ``notify``
        False skips the hooks (a policy's tentative, rolled-back placement inside one pass).
        """
        # plain Python over the job's few GPU slots: numpy's fixed cost per call is larger
        # than the work here, and it runs twice per job (the same float operations)
        n = self.index[alloc.node]
        idx = alloc.gpu_indices
        g = int(self.gpu_count[n])
        if any(not 0 <= j < g for j in idx):
            raise OverAllocation(f"{alloc.job_id}: GPU index out of range on {alloc.node}")
        if len(set(idx)) != len(idx):
            raise OverAllocation(f"{alloc.job_id}: repeated GPU index on {alloc.node}")
        row, used = self.free_share[n], self.mem_used_gb[n]
        share = alloc.gpu_share
        if any(row[j] < share - EPS for j in idx):
            raise OverAllocation(f"{alloc.job_id}: GPU share not free on {alloc.node}")
        if self.host_free_gb[n] < alloc.host_mem_gb - EPS or self.cpus_free[n] < alloc.cpus - EPS:
            raise OverAllocation(f"{alloc.job_id}: host memory or CPUs not free on {alloc.node}")
        for j in idx:
            row[j] -= share
            used[j] += alloc.gpu_mem_gb
        self.host_free_gb[n] -= alloc.host_mem_gb
        self.cpus_free[n] -= alloc.cpus
        self.allocated_gpus += share * len(idx)
        self._whole_free[n] = sum(1 for v in row.tolist() if v >= 1.0 - EPS)
        self._version += 1
        cap = self.gpu_mem_gb[n] + EPS
        fits = all(used[j] <= cap for j in idx)
        if notify:
            for hook in self._view_hooks:
                hook("allocate", alloc)
        return fits

    def release(self, alloc: Allocation, notify: bool = True) -> None:
        n = self.index[alloc.node]
        idx = alloc.gpu_indices
        row, used = self.free_share[n], self.mem_used_gb[n]
        for j in idx:
            v = row[j] + alloc.gpu_share
            row[j] = 1.0 if v > 1.0 else v  # rounding noise never frees more than a GPU
            used[j] -= alloc.gpu_mem_gb
        self.host_free_gb[n] += alloc.host_mem_gb
        self.cpus_free[n] += alloc.cpus
        self.allocated_gpus -= alloc.gpu_share * len(idx)
        self._whole_free[n] = sum(1 for v in row.tolist() if v >= 1.0 - EPS)
        self._version += 1
        if notify:
            for hook in self._view_hooks:
                hook("release", alloc)

    # ----- queries -------------------------------------------------------------------------
    def free_whole(self) -> np.ndarray:
        """Whole free GPUs per node (do not modify)."""
        return self._whole_free

    def might_fit(self, gpus: float, mem_gb: float) -> bool:
        """Cheap necessary condition for a single-node fit: some node with ``mem_gb`` per GPU
        has ``gpus`` whole GPUs (or, for a fraction, that share of one GPU) free. Plain Python
        on a per-version cache: it runs once per waiting job per pass."""
        cache = self._tiers_now()
        k = bisect.bisect_left(self._tier_list, mem_gb - EPS)
        if k >= len(self._tier_list):
            return False
        if gpus < 1.0:
            return cache[2][k] >= gpus - EPS
        return cache[1][k] >= gpus

    def total_whole_free(self) -> int:
        """Whole free GPUs in the cluster (per-version cache, as ``might_fit``'s)."""
        return self._tiers_now()[3]

    def _tiers_now(self) -> tuple:
        """(version, per GPU-memory tier: the most whole free GPUs on one node and the largest
        free share of one GPU among nodes of at least that memory, total whole free GPUs),
        computed once per version in one compiled pass over the nodes."""
        cache = self._tier_cache
        if cache is None or cache[0] != self._version:
            whole, share, total = _tier_maxima(
                self._whole_free, self.free_share, self.gpu_mem_gb, self._tiers
            )
            cache = self._tier_cache = (self._version, whole.tolist(), share.tolist(), total)
        return cache

    def widest(self, constraints: tuple[str, ...]) -> int:
        """The most GPUs one admissible node has (a wider job must span nodes)."""
        w = self._widest.get(constraints)
        if w is None:
            mask = self.model_mask(constraints)
            w = self._widest[constraints] = int(self.gpu_count[mask].max()) if mask.any() else 0
        return w

    def model_mask(self, constraints: tuple[str, ...]) -> np.ndarray:
        """Nodes whose GPU model one of the (alternative) constraints admits (do not modify)."""
        mask = self._mask_cache.get(constraints)
        if mask is None:
            ok = np.array([any(matches(c, m) for c in constraints) for m in self.models])
            mask = ok[self.model_index] if constraints else np.ones(len(self.nodes), dtype=bool)
            self._mask_cache[constraints] = mask
        return mask

    def first_fit(
        self, spec: JobSpec, *, check_memory: bool, node_mask: np.ndarray | None = None
    ) -> list[Allocation] | None:
        """The first node (in cluster order) that holds ``spec``, or None.

        ``check_memory=False`` counts GPUs only, as Kubernetes' default GPU counting does: the job
        may land where its GPU memory does not fit (and then dies with OOM). A job larger than
        every node is spread over whole free nodes' GPUs in order (a gang across nodes).
        """
        mask = self.model_mask(spec.constraints)
        if node_mask is not None:
            mask = mask & node_mask
        mem_need = spec.gpu_mem_gb if check_memory else 0.0
        if spec.gpus < 1.0:
            return self._fit_fraction(spec, mask, mem_need)
        need = round(spec.gpus)
        host_ok = (self.host_free_gb >= spec.host_mem_gb - EPS) & (
            self.cpus_free >= spec.cpus - EPS
        )
        if check_memory:
            mask = mask & (self.gpu_mem_gb >= spec.gpu_mem_gb - EPS)
        free = self.free_whole()
        if not mask.any():
            return None
        if need <= int(self.gpu_count[mask].max()):
            cand = np.flatnonzero(mask & host_ok & (free >= need))
            if cand.size == 0:
                return None
            n = int(cand[0])
            return [self._whole(spec, n, need)]
        return self._fit_gang(spec, mask, host_ok, free, need)

    def _whole(self, spec: JobSpec, n: int, count: int, share_of_host: float = 1.0) -> Allocation:
        idx = np.flatnonzero(self.free_share[n] >= 1.0 - EPS)[:count]
        return Allocation(
            job_id=spec.id,
            node=self.nodes[n].id,
            gpu_indices=tuple(int(i) for i in idx),
            gpu_share=1.0,
            gpu_mem_gb=spec.gpu_mem_gb,
            host_mem_gb=spec.host_mem_gb * share_of_host,
            cpus=spec.cpus * share_of_host,
            time=0.0,
        )

    def _fit_gang(
        self, spec: JobSpec, mask: np.ndarray, host_ok: np.ndarray, free: np.ndarray, need: int
    ) -> list[Allocation] | None:
        """Whole free nodes first, in order, until ``need`` GPUs are gathered.

        Host memory and CPUs are split in proportion to the GPUs taken on each node.
        """
        per_gpu_host = spec.host_mem_gb / need
        per_gpu_cpu = spec.cpus / need
        cand = np.flatnonzero(mask & (free > 0))
        got: list[tuple[int, int]] = []
        left = need
        for n in cand:
            take = int(min(free[n], left))
            if (
                self.host_free_gb[n] < per_gpu_host * take - EPS
                or self.cpus_free[n] < per_gpu_cpu * take - EPS
            ):
                continue
            got.append((int(n), take))
            left -= take
            if left == 0:
                break
        if left > 0:
            return None
        return [self._whole(spec, n, take, take / need) for n, take in got]

    def _fit_fraction(
        self, spec: JobSpec, mask: np.ndarray, mem_need: float
    ) -> list[Allocation] | None:
        host_ok = (self.host_free_gb >= spec.host_mem_gb - EPS) & (
            self.cpus_free >= spec.cpus - EPS
        )
        gpu_ok = self.free_share >= spec.gpus - EPS
        if mem_need > 0:
            gpu_ok &= (self.gpu_mem_gb[:, None] - self.mem_used_gb) >= mem_need - EPS
        ok = gpu_ok & (mask & host_ok)[:, None]
        hits = np.argwhere(ok)
        if hits.size == 0:
            return None
        n, g = (int(v) for v in hits[0])
        return [
            Allocation(
                job_id=spec.id,
                node=self.nodes[n].id,
                gpu_indices=(g,),
                gpu_share=float(spec.gpus),
                gpu_mem_gb=spec.gpu_mem_gb,
                host_mem_gb=spec.host_mem_gb,
                cpus=spec.cpus,
                time=0.0,
            )
        ]

    def could_ever_fit(self, spec: JobSpec, *, check_memory: bool = True) -> bool:
        """Whether ``spec`` fits this cluster when it is empty (else no policy can ever run it).
        Memoised per request shape: the node specs never change."""
        key = (spec.constraints, spec.gpus, spec.gpu_mem_gb, spec.host_mem_gb, spec.cpus)
        key += (check_memory,)
        hit = self._ever.get(key)
        if hit is None:
            hit = self._ever[key] = self._could_ever_fit(spec, check_memory)
        return hit

    def _could_ever_fit(self, spec: JobSpec, check_memory: bool) -> bool:
        mask = self.model_mask(spec.constraints)
        if check_memory:
            mask = mask & (self.gpu_mem_gb >= spec.gpu_mem_gb - EPS)
        if not mask.any():
            return False
        if spec.gpus < 1.0:
            return bool(
                np.any(mask & (self.host_mem_gb >= spec.host_mem_gb) & (self.cpus >= spec.cpus))
            )
        need = round(spec.gpus)
        single = mask & (self.gpu_count >= need)
        single &= (self.host_mem_gb >= spec.host_mem_gb) & (self.cpus >= spec.cpus)
        if single.any():
            return True
        return int(self.gpu_count[mask].sum()) >= need


@compiled
def _tier_maxima(whole_free, free_share, gpu_mem_gb, tiers):
    """Per tier t (ascending GPU memory sizes): the max of ``whole_free`` and of each node's
    largest free share over the nodes with ``gpu_mem_gb >= tiers[t]``; and the sum of
    ``whole_free``. Exact (maxima and an integer sum)."""
    n_t = len(tiers)
    whole = np.zeros(n_t, dtype=np.int64)
    share = np.zeros(n_t)
    seen = np.zeros(n_t, dtype=np.bool_)
    total = 0
    for i in range(len(whole_free)):
        total += whole_free[i]
        row = free_share[i, 0]
        for g in range(1, free_share.shape[1]):
            if free_share[i, g] > row:
                row = free_share[i, g]
        for t in range(n_t):
            if gpu_mem_gb[i] >= tiers[t]:
                if not seen[t] or whole_free[i] > whole[t]:
                    whole[t] = whole_free[i]
                if not seen[t] or row > share[t]:
                    share[t] = row
                seen[t] = True
    return whole, share, int(total)
