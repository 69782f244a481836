"""When ``mosaic up`` restarts a child, and when it gives up. Pure: times are passed in.

Why a policy and not "restart at once": a child that dies at start (a bad flag, a port taken)
would be restarted hundreds of times a minute and bury its own error in the log. So restarts
back off exponentially (1 s, 2 s, 4 s ... up to 30 s), a child that ran a minute before dying
starts again from 1 s (it was healthy, this is a new fault), and after ``max_restarts`` within
``window_s`` the supervisor stops the stack and names the log: something is wrong that a restart
does not fix. A child whose ``/healthz`` keeps answering 503 (a dead loop or lease task in a live
process) for ``unhealthy_after_s`` is treated as dead.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RestartPolicy:
    first_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    reset_after_s: float = 60.0  # a child that ran this long before dying starts from first
    max_restarts: int = 5  # ... more restarts than this within window_s: give up
    window_s: float = 60.0
    unhealthy_after_s: float = 20.0  # /healthz failing this long counts as dead


class GiveUp(Exception):
    """Too many restarts in the window; the message says how many and the last reason."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


@dataclass
class _Child:
    backoff_s: float
    restarts: deque[float] = field(default_factory=deque)
    due_at: float | None = None  # a restart is pending, due then
    reason: str = ""
    unhealthy_since: float | None = None


class Restarter:
    """Bookkeeping per child name: call ``exited`` when it died, ``due`` each round, and
    ``restarting`` just before starting it again."""

    def __init__(self, policy: RestartPolicy | None = None) -> None:
        self.policy = policy or RestartPolicy()
        self._children: dict[str, _Child] = {}

    def _child(self, name: str) -> _Child:
        if name not in self._children:
            self._children[name] = _Child(backoff_s=self.policy.first_backoff_s)
        return self._children[name]

    def pending(self, name: str) -> bool:
        return self._child(name).due_at is not None

    def exited(self, name: str, *, now: float, ran_s: float, reason: str) -> float:
        """Schedule a restart of a child that died after running ``ran_s``; returns when it is
        due. Raises ``GiveUp`` when the window already holds ``max_restarts`` restarts."""
        p, c = self.policy, self._child(name)
        while c.restarts and now - c.restarts[0] > p.window_s:
            c.restarts.popleft()
        if len(c.restarts) >= p.max_restarts:
            raise GiveUp(
                name,
                f"{name} failed again ({reason}) after {len(c.restarts)} restarts within "
                f"{p.window_s:.0f} s",
            )
        if ran_s >= p.reset_after_s:
            c.backoff_s = p.first_backoff_s
        c.due_at = now + c.backoff_s
        c.backoff_s = min(c.backoff_s * 2, p.max_backoff_s)
        c.reason = reason
        c.unhealthy_since = None
        return c.due_at

    def due(self, name: str, now: float) -> bool:
        c = self._child(name)
        return c.due_at is not None and now >= c.due_at

    def restarting(self, name: str, now: float) -> str:
        """Record the restart; returns the reason it was needed."""
        c = self._child(name)
        c.due_at = None
        c.restarts.append(now)
        return c.reason

    def unhealthy(self, name: str, *, now: float, problem: str | None) -> bool:
        """Feed one ``/healthz`` answer (None = healthy); True once it has failed for
        ``unhealthy_after_s`` in a row: the caller stops the child and reports ``exited``."""
        c = self._child(name)
        if problem is None:
            c.unhealthy_since = None
            return False
        if c.unhealthy_since is None:
            c.unhealthy_since = now
        return now - c.unhealthy_since >= self.policy.unhealthy_after_s
