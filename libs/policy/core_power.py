"""The scheduler's node power, as the part of ``core.Scheduler`` that decides and hears it.

Why apart from ``core``: suspending idle nodes and waking them (``power_state.PowerState``, the
stage ``stages.power``, the warm reserve ``warm``) has its own events (a node up, what a node
says of its power) and its own decision (``power_step``); ``core.Scheduler`` inherits these.
A node the power stage decided to suspend or wake is held (cordon ``POWER_HOLD``) until it is
awake again, so no pass places on a node that is going to sleep or still booting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from libs.policy.power_state import PowerStep

if TYPE_CHECKING:
    from libs.policy.core import Scheduler

POWER_HOLD = "power"  # the cordon hold of a suspended or booting node


class PowerMixin:
    """``core.Scheduler``'s node power (see the module docstring)."""

    def node_resumed(self: Scheduler, node_id: str, now: float) -> None:
        """A booting node is up: it takes jobs again."""
        self.power.resumed(self.view.index[node_id], now)
        self.set_cordoned(node_id, POWER_HOLD, False)

    def power_fact(self: Scheduler, node_id: str, state: str, now: float) -> None:
        """What a node says of its power ("awake", "asleep", "waking"), where it differs from
        what this scheduler decided: a node that refused to suspend (it was busy), a node
        already asleep when this scheduler was built (a placer restart), a node woken by
        someone else. The scheduler takes the node's word."""
        i = self.view.index.get(node_id)
        if i is None:
            return
        p = self.power
        if state == "awake" and (p.suspended[i] or p.resuming[i]):
            p.suspended[i] = False
            self.node_resumed(node_id, now)
        elif state == "asleep" and not (p.suspended[i] or p.resuming[i]):
            p.suspended[i] = True
            self.set_cordoned(node_id, POWER_HOLD, True)
        elif state == "waking" and not p.resuming[i]:
            p.suspended[i], p.resuming[i] = False, True
            self.set_cordoned(node_id, POWER_HOLD, True)

    def power_state(self: Scheduler, node_id: str) -> str:
        """This scheduler's idea of a node's power: "awake", "asleep" or "waking"."""
        i = self.view.index[node_id]
        if self.power.resuming[i]:
            return "waking"
        return "asleep" if self.power.suspended[i] else "awake"

    def power_reason(self: Scheduler, node_id: str, now: float) -> str:
        """Why a node is in its power state, in words (``mosaic nodes``, the power commands'
        audit): "asleep", "waking", or "awake" with the warm reserve's rule when that is what
        keeps an idle node up (``power_state.PowerState.kept_by_reserve``)."""
        state = self.power_state(node_id)
        if state != "awake":
            return state
        kept = self.power.kept_by_reserve(self.view.index[node_id], now)
        return "awake" if kept is None else f"awake: {kept}"

    def power_step(self: Scheduler, now: float) -> PowerStep:
        """Which nodes to suspend and resume now (view indices); the decided nodes are held
        (cordoned) in the view until ``node_resumed``. A node moves hold as a room is never
        suspended, and is woken when it sleeps (``PowerState.hold_rooms``)."""
        if not self.cfg.power_saving:
            return PowerStep((), (), None)
        self._policy_at(now)
        index = self.view.index
        rooms = tuple(sorted({index[node] for node, _ in self.moves.rooms.values()}))
        woken = self.power.hold_rooms(rooms) if rooms or self.power.rooms else ()
        step = self.power.step(now, self.queue)
        if woken:  # a move's room on a node that slept (stages.boot): woken with the step's
            step = PowerStep(step.suspend, woken + step.resume, step.next_s, step.warm)
        if step.suspend or step.resume:  # most steps decide nothing
            ids = self.view.node_ids
            for i in step.suspend + step.resume:
                self.set_cordoned(ids[i], POWER_HOLD, True)
        return step
