"""``ClusterView``: the cluster as numpy arrays, built once per cycle and updated in place.

Why arrays: every filter and score is evaluated for all nodes at once (vectorised), and the
simulator applies thousands of starts/finishes per second, so ``allocate``/``release`` touch one
row only (O(Gmax)). Row ``i`` is node ``node_ids[i]``; GPU slot ``j`` of a node exists when
``j < gpu_total[i]`` (the other columns stay 0, so they never look free).

Write node state through ``allocate``/``release``/``set_cordoned``/``set_temp`` only: they move
the change counters (``gen``, ``freed_gen``) the scheduler's cross-pass memos rely on.

GPU memory may go negative: the GPU-count-only baseline (``first_fit(check_memory=False)``) can
oversubscribe it, and the executor then fails the job with OOM. GPU *shares* may not exceed 1:
``allocate`` refuses that with a ValueError (it would be double booking).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from libs.policy.memo import ShapeMemo, ViewMemo
from proto.jobs import JobSpec
from proto.ledger import Allocation, node_allocations
from proto.nodes import NodeSpec

EPS = 1e-9
RESOURCES: tuple[str, ...] = ("gpus", "gpu_mem_gb", "host_mem_gb", "cpus")


@dataclass(slots=True)
class ClusterView:
    nodes: list[NodeSpec]
    node_ids: list[str]
    index: dict[str, int]
    models: list[str]  # distinct GPU models, in first-seen order
    model_idx: np.ndarray  # int[N] into models
    gpu_total: np.ndarray  # int[N]
    gpu_exists: np.ndarray  # bool[N, Gmax]
    gpu_free: np.ndarray  # float[N, Gmax]: free share of each GPU slot
    gpu_mem_gb: np.ndarray  # float[N] per GPU
    gpu_mem_free_gb: np.ndarray  # float[N, Gmax]
    host_mem_gb: np.ndarray  # float[N] total
    host_mem_free_gb: np.ndarray  # float[N]
    cpus: np.ndarray  # float[N] total
    cpus_free: np.ndarray  # float[N]
    whole_free: np.ndarray  # int[N]: GPUs with their whole share free (kept in step)
    temp_c: np.ndarray  # float[N]; NaN = unknown
    power_w: np.ndarray  # float[N]; NaN = unknown
    cordoned: np.ndarray  # bool[N]
    # bool[N]: nodes placement keeps averse jobs off (``stages.heat``; kept by core.Scheduler)
    heat_risky: np.ndarray
    idle_power_w: np.ndarray  # float[N] per GPU
    max_power_w: np.ndarray  # float[N] per GPU
    # memo of shape-only results (static filter masks): node specs never change in a view
    shape_memo: ShapeMemo = field(default_factory=ShapeMemo, repr=False, compare=False)
    # change counters: ``gen`` moves on every change of free resources or node state,
    # ``freed_gen`` only on changes that can let a job fit that did not (release, uncordon,
    # temperature). The scheduler keys its cross-pass memos (``memo``) on them.
    gen: int = 0
    freed_gen: int = 0
    # int[N]: moves with every change of that node (``gen`` counts them all): memos of
    # per-node answers (a reservation's earliest start there) stay valid while it stands
    node_gen: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # moves when a node becomes empty (every GPU whole and free) or stops being empty: the
    # power decision (``power.empty_nodes``) reads the view through that alone
    empty_gen: int = 0
    # moves when a node is cordoned or uncordoned or its temperature changes (``set_cordoned``,
    # ``set_temp``): the nodes' availability (``filters.available``) reads only that
    state_gen: int = 0
    memo: ViewMemo = field(default_factory=ViewMemo, repr=False, compare=False)
    # (row, GPU slot) -> {job id: spec (None: the ledger did not carry it)} of the fractional
    # jobs on that GPU: who a new fraction would share with (``stages.share``, issue 16)
    residents: dict[tuple[int, int], dict[str, JobSpec | None]] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        nodes: Sequence[NodeSpec],
        allocations: Iterable[Allocation] = (),
        *,
        temp_c: Mapping[str, float] | None = None,
        power_w: Mapping[str, float] | None = None,
        cordoned: Collection[str] = (),
    ) -> ClusterView:
        nodes = list(nodes)
        ids = [n.id for n in nodes]
        index = {nid: i for i, nid in enumerate(ids)}
        if len(index) != len(ids):
            raise ValueError("ClusterView.build: node ids are not unique")
        gmax = max((nd.gpu_count for nd in nodes), default=0)
        models: list[str] = []
        midx: dict[str, int] = {}
        for nd in nodes:
            if nd.gpu_count < 0:
                raise ValueError(f"node {nd.id}: gpu_count must be >= 0")
            midx.setdefault(nd.gpu_model, len(models))
            if len(midx) > len(models):
                models.append(nd.gpu_model)
        gpu_total = np.array([nd.gpu_count for nd in nodes], dtype=np.int64)
        exists = np.arange(max(gmax, 1))[None, :] < gpu_total[:, None]
        if gmax == 0:
            exists = exists[:, :0]
        mem = np.array([nd.gpu_mem_gb for nd in nodes], dtype=float)
        host = np.array([nd.host_mem_gb for nd in nodes], dtype=float)
        cpus = np.array([nd.cpus for nd in nodes], dtype=float)
        unknown = set(cordoned) - set(index)
        if unknown:
            raise ValueError(f"ClusterView.build: cordoned nodes not in cluster: {sorted(unknown)}")
        view = cls(
            nodes=nodes,
            node_ids=ids,
            index=index,
            models=models,
            model_idx=np.array([midx[nd.gpu_model] for nd in nodes], dtype=np.int64),
            gpu_total=gpu_total,
            gpu_exists=exists,
            gpu_free=exists.astype(float),
            gpu_mem_gb=mem,
            gpu_mem_free_gb=exists * mem[:, None],
            host_mem_gb=host,
            host_mem_free_gb=host.copy(),
            cpus=cpus,
            cpus_free=cpus.copy(),
            whole_free=gpu_total.copy(),
            temp_c=np.array([(temp_c or {}).get(i, np.nan) for i in ids], dtype=float),
            power_w=np.array([(power_w or {}).get(i, np.nan) for i in ids], dtype=float),
            cordoned=np.array([i in set(cordoned) for i in ids], dtype=bool),
            heat_risky=np.zeros(len(ids), dtype=bool),
            idle_power_w=np.array([nd.idle_power_w for nd in nodes], dtype=float),
            max_power_w=np.array([nd.max_power_w for nd in nodes], dtype=float),
            node_gen=np.zeros(len(nodes), dtype=np.int64),
        )
        for a in allocations:
            view.allocate(a)
        return view

    # --- in-place updates -------------------------------------------------------------------
    def _row(self, alloc: Allocation) -> int:
        i = self.index.get(alloc.node)
        if i is None:
            raise ValueError(f"allocation {alloc.job_id}: node {alloc.node!r} is not in the view")
        g = int(self.gpu_total[i])
        for j in alloc.gpu_indices:
            if not 0 <= j < g:
                raise ValueError(
                    f"allocation {alloc.job_id}: GPU index {j} outside node {alloc.node} "
                    f"(0..{g - 1})"
                )
        if len(set(alloc.gpu_indices)) != len(alloc.gpu_indices):
            raise ValueError(f"allocation {alloc.job_id}: repeated GPU index")
        if not 0.0 < alloc.gpu_share <= 1.0 + EPS:
            raise ValueError(f"allocation {alloc.job_id}: gpu_share must be in (0, 1]")
        return i

    def allocate(self, alloc: Allocation) -> None:
        """Take ``alloc``'s resources (a gang's on each of its nodes, all or none). Raises
        ValueError if a GPU share would go above 1."""
        if alloc.parts:
            parts = node_allocations(alloc)
            for p in parts:  # check every part before taking any: all or nothing
                self._check_free(self._row(p), p)
            for p in parts:
                self.allocate(p)
            return
        i = self._row(alloc)
        self._check_free(i, alloc)
        self._apply(i, list(alloc.gpu_indices), -alloc.gpu_share, -alloc.gpu_mem_gb,
                    -alloc.host_mem_gb, -alloc.cpus)  # fmt: skip
        if alloc.gpu_share < 1.0 - EPS:  # who shares each GPU (stages.share)
            for j in alloc.gpu_indices:
                self.residents.setdefault((i, j), {})[alloc.job_id] = alloc.spec

    def _check_free(self, i: int, alloc: Allocation) -> None:
        idx = alloc.gpu_indices
        row = self.gpu_free[i]
        need = alloc.gpu_share - EPS
        if any(row[j] < need for j in idx):  # a few slots: plain Python beats a numpy call
            raise ValueError(
                f"allocation {alloc.job_id}: GPUs {list(idx)} on {alloc.node} do not have "
                f"{alloc.gpu_share:g} free (double booking)"
            )

    def release(self, alloc: Allocation) -> None:
        """Give back what ``allocate(alloc)`` took (the exact inverse, up to float rounding)."""
        if alloc.parts:
            for p in node_allocations(alloc):
                self.release(p)
            return
        i = self._row(alloc)
        a = alloc
        self._apply(i, list(a.gpu_indices), a.gpu_share, a.gpu_mem_gb, a.host_mem_gb, a.cpus)
        if a.gpu_share < 1.0 - EPS:
            for j in a.gpu_indices:
                here = self.residents.get((i, j))
                if here is not None:
                    here.pop(a.job_id, None)
                    if not here:
                        del self.residents[(i, j)]

    def _apply(self, i: int, idx: list[int], share: float, mem: float, host: float, cpu: float):
        self.gen += 1
        self.node_gen[i] += 1
        if share > 0 or mem > 0 or host > 0 or cpu > 0:
            self.freed_gen += 1
        # plain-Python loops: a job touches at most Gmax slots, where numpy calls cost more
        if idx:
            row = self.gpu_free[i]
            mrow = self.gpu_mem_free_gb[i]
            cap = float(self.gpu_mem_gb[i])
            for j in idx:
                v = float(row[j]) + share
                m = float(mrow[j]) + mem
                if share > 0:  # snap rounding noise back to the exact capacity
                    v = 1.0 if v > 1.0 - EPS else v
                    m = cap if abs(m - cap) < 1e-6 else m
                row[j] = v
                mrow[j] = m
            one = 1.0 - EPS
            whole = sum(1 for v in row.tolist() if v >= one)
            total = self.gpu_total[i]
            if (self.whole_free[i] >= total) != (whole >= total):
                self.empty_gen += 1
            self.whole_free[i] = whole
        h = float(self.host_mem_free_gb[i]) + host
        c = float(self.cpus_free[i]) + cpu
        if host > 0 and abs(h - self.host_mem_gb[i]) < 1e-6:
            h = float(self.host_mem_gb[i])
        if cpu > 0 and abs(c - self.cpus[i]) < 1e-6:
            c = float(self.cpus[i])
        self.host_mem_free_gb[i] = h
        self.cpus_free[i] = c

    def set_cordoned(self, node_id: str, value: bool = True) -> None:
        i = self.index[node_id]
        self.cordoned[i] = value
        self.node_gen[i] += 1
        self.gen += 1
        self.freed_gen += 1
        self.state_gen += 1

    def set_temp(self, node_id: str, temp_c: float) -> None:
        i = self.index[node_id]
        self.temp_c[i] = temp_c
        self.node_gen[i] += 1
        self.gen += 1
        self.freed_gen += 1
        self.state_gen += 1

    # --- reads ------------------------------------------------------------------------------
    def free_gpus(self) -> np.ndarray:
        """Whole free GPUs per node (int[N])."""
        return self.whole_free

    def total_gpus(self) -> int:
        """GPUs in the view (memoised: node specs never change in a view)."""
        hit = self.shape_memo.total_gpus
        if hit is None:
            hit = self.shape_memo.total_gpus = int(self.gpu_total.sum())
        return hit

    def load(self) -> float:
        """Allocated GPU share / total GPUs (0 for an empty cluster); memoised until the view
        changes (``gen``): an arrival's pass sees the view of the pass before."""
        hit = self.memo.load
        if hit is not None and hit[0] == self.gen:
            return hit[1]
        total = float(self.total_gpus())
        load = 0.0 if total <= 0 else float(1.0 - self.gpu_free.sum() / total)
        self.memo.load = (self.gen, load)
        return load

    def capacity(self) -> np.ndarray:
        """Totals per resource in ``RESOURCES`` order, for dominant-share fairness (memoised:
        totals depend on the node specs only; read-only)."""
        hit = self.shape_memo.capacity
        if hit is None:
            hit = self.shape_memo.capacity = self._capacity()
            hit.setflags(write=False)
        return hit

    def _capacity(self) -> np.ndarray:
        return np.array(
            [
                float(self.gpu_total.sum()),
                float((self.gpu_total * self.gpu_mem_gb).sum()),
                float(self.host_mem_gb.sum()),
                float(self.cpus.sum()),
            ]
        )

    def copy(self) -> ClusterView:
        """A deep copy of the mutable arrays (specs are shared): for what-if planning."""
        c = ClusterView(**{f: getattr(self, f) for f in self.__dataclass_fields__})
        c.shape_memo = self.shape_memo  # same specs: the memo stays valid
        c.memo = ViewMemo()  # the copy's free resources will diverge from ours
        for f in (
            "gpu_free",
            "gpu_mem_free_gb",
            "host_mem_free_gb",
            "cpus_free",
            "whole_free",
            "temp_c",
            "power_w",
            "cordoned",
            "node_gen",
        ):
            setattr(c, f, getattr(self, f).copy())
        c.residents = {k: dict(v) for k, v in self.residents.items()}
        return c
