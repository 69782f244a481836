"""The move rules' searches, answered from memory while what they read holds (issue 13's speed).

Why: the priority-protection and short-wait rules look again every ``interval_s`` on a full
cluster, and the grow-back rule at every instant; each look re-ran the same searches on nodes
where nothing had changed (a full Philly replay: about 900,000 victim searches and 430,000
resume-room searches, 60% of the rules' time). Each answer here is kept under a key made of
exactly what its definition reads, so a hit is the answer the definition would give:

* ``PlanMemo.victims``, ``stages.preempt.node_victims``: reads node ``i``'s free resources (its
  change counter ``ClusterView.node_gen[i]``, bumped by every allocation, release, cordon and
  temperature on the node), the blocked job's request (GPUs, GPU memory, host memory, CPUs)
  and the candidates it may take, in order (their ids: a running job on a node whose counter
  did not move is the same attempt). Kept per node until its counter moves.
* ``PlanMemo.rooms``, ``stages.resume.resume_rooms``: reads the room each node has
  (``soon_free``), each node's free host memory and CPUs, the cordons and temperatures
  (``state_gen``), which nodes ran hot, the victims themselves, the node being cleared and
  the speed table; a fractional victim also reads every GPU's free share
  (``ClusterView.gen``). Kept until the room, spare host memory or CPUs, cordons or heat move.
  A search it has not seen is skipped when a whole-GPU victim is wider than the largest room
  (``_no_room``: the search could not pass; on a full cluster, most of them).
* ``GrowMemo``, ``stages.grow.grow_plan`` when it grew no one: each shrunk job's refusal
  (``grow_size``) reads its own node (``node_gen``), the waiting jobs (``PendingQueue.version``,
  only if the refusal got to that check: ``grow.WANTED``), its attempt and move history (the
  move book's ``_ver``, bumped only for shrunk jobs), and time only through two windows that
  only end (``preempt.time_protected``) and a gain that only shrinks. So the empty answer
  holds, while those are the same, until a window that refused a job ends.

One memo per ``moves.MoveBook`` (no module state); a new view clears it. ``verify`` runs the
definitions beside every answer and raises on a difference (``tests/policy/test_plans.py``
replays with it on).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.stages import grow as G
from libs.policy.stages import preempt as P
from libs.policy.stages.filter import is_fractional, whole_gpus
from libs.policy.stages.resume import resume_rooms
from libs.policy.types import PendingJob, RunningJob

_MISSING = object()


class PlanMemo:
    """``stages.preempt.PlanSearch`` from memory (module docstring)."""

    def __init__(self, *, verify: bool = False) -> None:
        self.verify = verify
        self._view: ClusterView | None = None
        # node -> (its node_gen, {(request, candidate ids): victims' kept sizes, or None})
        self._victims: dict[int, tuple[int, dict[tuple, tuple[int, ...] | None]]] = {}
        self._rooms_key: tuple | None = None  # (cfg, state_gen, room, heat) of ``_rooms``
        self._rooms: dict[tuple, tuple[tuple, dict[str, int] | None]] = {}
        self.hits = 0  # answers given from memory (for the profile's account)
        self.misses = 0

    def _same_view(self, view: ClusterView) -> None:
        if view is not self._view:  # its counters start again: nothing kept holds
            self._view = view
            self._victims = {}
            self._rooms_key = None

    def victims(
        self,
        blocked: PendingJob,
        i: int,
        candidates: list[tuple[float, float, RunningJob]],
        view: ClusterView,
        most: int,
    ) -> list[P.Release] | None:
        """``stages.preempt.node_victims``, kept per node while ``node_gen[i]`` holds."""
        self._same_view(view)
        prefix = candidates[:most]
        s = blocked.spec
        key = (s.gpus, s.gpu_mem_gb, s.host_mem_gb, s.cpus, tuple(c[2].spec.id for c in prefix))
        gen = int(view.node_gen[i])
        node = self._victims.get(i)
        if node is None or node[0] != gen:
            node = self._victims[i] = (gen, {})
        kept = node[1].get(key, _MISSING)
        if kept is _MISSING:
            self.misses += 1
            out = P.node_victims(blocked, i, candidates, view, most)
            node[1][key] = None if out is None else tuple(k for _, k in out)
        else:
            self.hits += 1
            sizes: tuple[int, ...] | None = kept  # type: ignore[assignment]
            out = None if sizes is None else [(prefix[n][2], k) for n, k in enumerate(sizes)]
            if self.verify:
                want = P.node_victims(blocked, i, candidates, view, most)
                if want != out:
                    raise AssertionError(f"node_victims memo on node {i}: {out} != {want}")
        return out

    def rooms(
        self,
        stopped: Sequence[RunningJob],
        view: ClusterView,
        soon_free: np.ndarray,
        cfg: PolicyConfig,
        exclude: int,
        speed: np.ndarray | None = None,
    ) -> dict[str, int] | None:
        """``stages.resume.resume_rooms`` (``exclude``: the node being cleared), kept while
        the room per node, its free host memory and CPUs, the cordons, temperatures and heat
        hold; a copy the caller owns."""
        if not stopped:
            return resume_rooms(stopped, view, soon_free, cfg, exclude=exclude, speed=speed)
        self._same_view(view)
        spare = view.host_mem_free_gb.tobytes() + view.cpus_free.tobytes()
        epoch = (cfg, view.state_gen, soon_free.tobytes(), view.heat_risky.tobytes(), spare)
        last = self._rooms_key
        if last is None or last[0] is not cfg or last[1:5] != epoch[1:]:
            self._rooms_key = (*epoch, None)  # (+ the largest room, once asked: ``_no_room``)
            self._rooms = {}
        frac = any(is_fractional(r.spec) for r in stopped)
        speed_key = None if speed is None else speed.tobytes()
        # the victims by identity: the entry keeps them, so no id is reused while it lives
        key = (exclude, speed_key, view.gen if frac else -1, tuple(map(id, stopped)))
        hit = self._rooms.get(key)
        if hit is None:
            self.misses += 1
            if self._no_room(stopped, soon_free):
                out = None
                if self.verify and resume_rooms(stopped, view, soon_free, cfg, exclude=exclude):
                    raise AssertionError("resume_rooms bound: no room, but the search found one")
            else:
                out = resume_rooms(stopped, view, soon_free, cfg, exclude=exclude, speed=speed)
            self._rooms[key] = (tuple(stopped), None if out is None else dict(out))
            return out
        self.hits += 1
        got = None if hit[1] is None else dict(hit[1])
        if self.verify:
            want = resume_rooms(stopped, view, soon_free, cfg, exclude=exclude, speed=speed)
            if want != got:
                raise AssertionError(f"resume_rooms memo (exclude {exclude}): {got} != {want}")
        return got

    def _no_room(self, stopped: Sequence[RunningJob], soon_free: np.ndarray) -> bool:
        """A bound ``resume_rooms`` cannot pass: a whole-GPU victim needs a node with that
        many GPUs of room, and no node has (the victims before it only take room away). On a
        full cluster this is most searches. The largest room is the epoch's (same bytes)."""
        e = self._rooms_key
        assert e is not None
        if e[5] is None:
            e = self._rooms_key = (*e[:5], float(soon_free.max()) if len(soon_free) else 0.0)
        most = e[5]
        return any(not is_fractional(r.spec) and most < whole_gpus(r.spec) - EPS for r in stopped)


@dataclass(frozen=True, slots=True)
class _NoGrow:
    """What a grow step that decided nothing read (``GrowMemo``)."""

    book_ver: int  # ``MoveBook``'s version: the running, shrunk and moving jobs, their facts
    view: ClusterView
    cfg: PolicyConfig
    nodes: np.ndarray  # the shrunk running jobs' nodes
    gens: bytes  # their ``node_gen``
    queue: int | None  # ``PendingQueue.version``, when a refusal read the waiting jobs
    timed: tuple[P.MoveFacts, ...]  # the facts of the jobs a time window refused


class GrowMemo:
    """``stages.grow.grow_plan`` that decided nothing, kept while it would again (module
    docstring): the grow rule runs at every instant, and almost every instant it grows no
    one for the same reasons as before."""

    def __init__(self, *, verify: bool = False) -> None:
        self.verify = verify
        self._none: _NoGrow | None = None
        self.hits = 0  # steps answered from memory

    def holds(self, book_ver: int, view: ClusterView, cfg: PolicyConfig, queue: int, now: float):
        """Would ``grow_plan`` grow no one now, as it did the last time it was asked?"""
        k = self._none
        if k is None or k.book_ver != book_ver or k.view is not view or k.cfg is not cfg:
            return False
        if (k.queue is not None and k.queue != queue) or view.node_gen[k.nodes].tobytes() != k.gens:
            return False
        pc = cfg.preempt
        if not all(P.time_protected(f, now, pc) for f in k.timed):
            return False
        self.hits += 1
        return True

    def plan(
        self,
        book_ver: int,
        shrunk: Mapping[str, int],
        jobs: Mapping[str, RunningJob],
        view: ClusterView,
        waiting: Sequence[PendingJob],
        queue: int,
        facts: Mapping[str, P.MoveFacts],
        now: float,
        cfg: PolicyConfig,
    ) -> list[G.Grow]:
        """``grow_plan`` (quiet: the caller checked), its loop run here so that an empty
        answer is kept with what each refusal read (``queue``: the waiting jobs'
        ``PendingQueue.version``). A refusal before the queue's check read only the job, its
        node and time; one by a window (``time_protected``) holds while the window does."""
        out: list[G.Grow] = []
        nodes: set[int] = set()
        seen: list[int] = []
        timed: list[P.MoveFacts] = []
        read_queue = False
        for jid in sorted(shrunk):
            job = jobs.get(jid)
            if job is None or job.node_index in nodes:
                continue
            f = facts.get(jid)
            to, why = G.grow_size(job, shrunk[jid], view, waiting, f, now, cfg)
            if to:
                out.append((job, to, why))
                nodes.add(job.node_index)
                continue
            seen.append(job.node_index)
            read_queue = read_queue or why.startswith(G.WANTED)
            if f is not None and P.time_protected(f, now, cfg.preempt):
                timed.append(f)
        if out:
            self._none = None
            return out
        idx = np.array(seen, dtype=np.int64)
        gens = view.node_gen[idx].tobytes()
        q = queue if read_queue else None
        self._none = _NoGrow(book_ver, view, cfg, idx, gens, q, tuple(timed))
        return out
