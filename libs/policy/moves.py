"""What the scheduler remembers to move jobs safely: the state behind ``stages.preempt``.

Why a record of its own: the protection rules read history a pass does not carry (when each
running attempt started, when each job was last moved, which moves are under way), and the
priority-protection plan wants the running jobs that could ever be moved, per node, without a
walk over every running job. ``MoveBook`` keeps those incrementally as the scheduler's events
arrive (``started``, ``ended``); ``core.Scheduler`` owns one and asks it for decisions
(``plan_priority``) and for the verdict on an intent (``check``). Pure state, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.decisions import MoveOrder
from libs.policy.stages import preempt as P
from libs.policy.types import PendingJob, RunningJob


def could_ever_move(job: RunningJob) -> bool:
    """Checkpointable or elastic and not inference: the jobs a plan may consider at all."""
    s = job.spec
    return s.kind != "inference" and (s.checkpointable or s.elastic is not None)


class MoveBook:
    def __init__(self) -> None:
        self.facts: dict[str, P.MoveFacts] = {}  # running job -> its attempt's history
        self.moved_at: dict[str, float] = {}  # job -> when it was last moved (across attempts)
        self.movers: dict[int, dict[str, RunningJob]] = {}  # node -> could-ever-move jobs
        self.attempts: dict[str, tuple[int, str]] = {}  # running job -> (attempt, node id)
        self.moving: dict[str, MoveOrder] = {}  # ordered, not yet ended

    # ----- events --------------------------------------------------------------------------
    def started(self, job: RunningJob, attempt: int, node: str, at: float) -> None:
        jid = job.spec.id
        self.facts[jid] = P.MoveFacts(started_at=at, last_moved_at=self.moved_at.get(jid))
        self.attempts[jid] = (attempt, node)
        if could_ever_move(job):
            self.movers.setdefault(job.node_index, {})[jid] = job

    def ended(self, job_id: str, node_index: int) -> MoveOrder | None:
        """The attempt stopped; the order that stopped it, if it was a move."""
        self.facts.pop(job_id, None)
        self.attempts.pop(job_id, None)
        d = self.movers.get(node_index)
        if d is not None:
            d.pop(job_id, None)
            if not d:
                del self.movers[node_index]
        return self.moving.pop(job_id, None)

    def forget(self, job_id: str) -> None:
        """The job left for good (a terminal state)."""
        self.moved_at.pop(job_id, None)

    # ----- decisions -----------------------------------------------------------------------
    def check(
        self,
        job_id: str,
        attempt: int,
        node: str,
        view: ClusterView,
        running: Iterable[RunningJob],
        now: float,
        cfg: PolicyConfig,
    ) -> str:
        """Why a move of ``job_id``'s attempt ``attempt`` on ``node`` is refused ("" if not)."""
        held = self.attempts.get(job_id)
        if held is None:
            return "not running"
        if held != (attempt, node):
            return f"stale: attempt {held[0]} runs on {held[1]}"
        if job_id in self.moving:
            return "already being moved"
        job = self.movers.get(view.index[node], {}).get(job_id)
        if job is None:
            return "neither checkpointable nor elastic, or an inference job"
        return P.may_move(job, self.facts, view, running, now, cfg)

    def order(self, move: MoveOrder, now: float) -> MoveOrder:
        self.moving[move.job_id] = move
        self.moved_at[move.job_id] = now
        return move

    def plan_priority(
        self,
        blocked: Sequence[PendingJob],
        view: ClusterView,
        running: Iterable[RunningJob],
        now: float,
        cfg: PolicyConfig,
    ) -> list[MoveOrder]:
        """The priority-protection rule's moves for this pass (``stages.preempt``), ordered."""
        movers = {
            i: [r for jid, r in d.items() if jid not in self.moving] for i, d in self.movers.items()
        }
        plan = P.priority_plan(blocked, movers, list(running), view, self.facts, now, cfg)
        if plan is None:
            return []
        out = []
        for v in plan.victims:
            attempt, node = self.attempts[v.job_id]
            mo = MoveOrder(v.job_id, attempt, node, "preempt", plan.reason, for_job=plan.for_job)
            out.append(self.order(mo, now))
        return out
