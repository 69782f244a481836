"""EASY backfill: a reservation for the blocked head job, and the rule that protects it.

The head job (highest rank that cannot start for lack of free resources) reserves the node where
it can start earliest, computed from running jobs' expected end times. A job below it may still
start now if it cannot delay that start: it lands on another node, or, on the reserved node, it
ends before the reserved start or leaves the head job's earliest start unchanged (it uses GPUs
the reservation does not need). Expected end times are estimates; a job that overran counts as
ending now.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from libs.policy import filters as F
from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.types import Reservation, RunningJob
from proto.jobs import JobSpec


@dataclass(frozen=True, slots=True)
class Release:
    """Resources a running job gives back at ``end`` on one node."""

    end: float
    gpu_indices: tuple[int, ...]
    share: float
    gpu_mem_gb: float
    host_mem_gb: float
    cpus: float

    @classmethod
    def of(cls, r: RunningJob, now: float) -> Release:
        s = r.spec
        end = max(r.expected_end, now)
        return cls(end, r.gpu_indices, r.gpu_share, s.gpu_mem_gb, s.host_mem_gb, s.cpus)


def releases_by_node(running: Sequence[RunningJob], now: float) -> dict[int, list[Release]]:
    out: dict[int, list[Release]] = {}
    for r in running:
        out.setdefault(r.node_index, []).append(Release.of(r, now))
    for v in out.values():
        v.sort(key=lambda x: x.end)
    return out


class LazyReleases:
    """Running jobs grouped by node; ``Release`` records are built (and sorted) only for the
    nodes a reservation actually examines (a pass usually looks at a few)."""

    def __init__(self, running: Sequence[RunningJob], now: float) -> None:
        self.now = now
        self._by_node: dict[int, list[RunningJob]] = {}
        for r in running:
            self._by_node.setdefault(r.node_index, []).append(r)
        self._built: dict[int, list[Release]] = {}

    def add(self, r: RunningJob) -> None:
        self._by_node.setdefault(r.node_index, []).append(r)
        self._built.pop(r.node_index, None)

    def get(self, node: int) -> list[Release]:
        hit = self._built.get(node)
        if hit is None:
            hit = sorted(
                (Release.of(r, self.now) for r in self._by_node.get(node, ())),
                key=lambda x: x.end,
            )
            self._built[node] = hit
        return hit


def _fits(spec: JobSpec, free: np.ndarray, mem: np.ndarray, host: float, cpus: float) -> bool:
    if host < spec.host_mem_gb - EPS or cpus < spec.cpus - EPS:
        return False
    if F.is_fractional(spec):
        return bool(((free >= spec.gpus - EPS) & (mem >= spec.gpu_mem_gb - EPS)).any())
    return int(np.count_nonzero(free >= 1.0 - EPS)) >= F.whole_gpus(spec)


def earliest_start(
    spec: JobSpec, view: ClusterView, node: int, releases: Sequence[Release], now: float
) -> float:
    """When ``spec`` could start on ``node`` as running jobs end (inf if never)."""
    free = view.gpu_free[node].copy()
    mem = view.gpu_mem_free_gb[node].copy()
    host = float(view.host_mem_free_gb[node])
    cpus = float(view.cpus_free[node])
    if _fits(spec, free, mem, host, cpus):
        return now
    for r in sorted(releases, key=lambda x: x.end):
        idx = list(r.gpu_indices)
        free[idx] += r.share
        mem[idx] += r.gpu_mem_gb
        host += r.host_mem_gb
        cpus += r.cpus
        if _fits(spec, free, mem, host, cpus):
            return r.end
    return float("inf")


def reserve(
    job_id: str,
    spec: JobSpec,
    view: ClusterView,
    running: Sequence[RunningJob] | LazyReleases,
    *,
    now: float,
    cfg: PolicyConfig,
) -> Reservation | None:
    """The earliest (node, start) for the blocked ``spec``; None when no eligible node ever frees
    enough (e.g. every eligible node is cordoned)."""
    rel = running if isinstance(running, LazyReleases) else LazyReleases(running, now)
    eligible = F.static_mask(spec, view) & F.f_cordon(spec, view) & F.f_thermal(spec, view, cfg)
    best: tuple[float, int] | None = None
    for n in np.flatnonzero(eligible):
        t = earliest_start(spec, view, int(n), rel.get(int(n)), now)
        if t < float("inf") and (best is None or t < best[0]):
            best = (t, int(n))
    if best is None:
        return None
    return Reservation(job_id, best[1], view.node_ids[best[1]], best[0])


def delays(
    head: JobSpec,
    reservation: Reservation,
    view: ClusterView,
    releases: Sequence[Release],
    candidate: Release,
    *,
    now: float,
) -> bool:
    """Would starting ``candidate`` now on the reserved node (not yet allocated in ``view``;
    it holds its resources until ``candidate.end``) push the head job's start later?"""
    if candidate.end <= reservation.start + EPS:
        return False
    n = reservation.node_index
    free = view.gpu_free[n].copy()
    mem = view.gpu_mem_free_gb[n].copy()
    idx = list(candidate.gpu_indices)
    free[idx] -= candidate.share
    mem[idx] -= candidate.gpu_mem_gb
    host = float(view.host_mem_free_gb[n]) - candidate.host_mem_gb
    cpus = float(view.cpus_free[n]) - candidate.cpus
    for r in releases:  # sorted by end (releases_by_node)
        if r.end > reservation.start + EPS:
            break
        ridx = list(r.gpu_indices)
        free[ridx] += r.share
        mem[ridx] += r.gpu_mem_gb
        host += r.host_mem_gb
        cpus += r.cpus
    return not _fits(head, free, mem, host, cpus)
