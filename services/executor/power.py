"""A node's power state machine, owned by its executor: awake → suspending → asleep → waking →
awake (``proto.power``).

Why here and not in the placer: whether a node is asleep is a fact about the node, with one
writer (rule 2); the placer decides *that* a node should sleep or wake (``node.<node>.power``)
and learns the outcome from the executor's reports, like any other fact about the node.

Rules:

- ``suspend`` is refused while the node runs or is ending an attempt (the refusal is kept in
  the state, so the reports show it); otherwise the node goes ``suspending``, the operator's
  suspend hook runs (if any), and it is ``asleep``. A suspend while waking cancels the wake.
- ``wake`` of a sleeping node makes it ``waking`` with ``ready_at = now + boot_s`` (Mosaic
  seconds), runs the wake hook, waits for ``ready_at`` on the Mosaic clock (so a stepped clock
  wakes it at the first step at or after ``ready_at``) and makes it ``awake`` since
  ``ready_at``. Repeats (``wake`` of an awake or waking node, ``suspend`` of a sleeping one) do
  nothing: a redelivered command is harmless.
- A run command for a node that is not awake is refused by the executor (``Preempted``, so the
  job is queued again, never lost).

Hooks: real power control (IPMI, ``systemctl suspend``, a BMC's API, wake-on-LAN from another
host) is the operator's, a command configured with ``--suspend-command`` / ``--wake-command``
(off by default: the state alone changes, which is all the simulated and local modes need). A
hook runs with ``MOSAIC_NODE`` and ``MOSAIC_POWER_ACTION`` in its environment; a non-zero exit
refuses the command and the node keeps its previous state. A node whose suspend hook really
suspends it stops reporting: the placer does not take that silence for a failure (it saw
``suspending``). The state is not journaled: an executor that (re)starts runs on a node that is
up, so it starts ``awake``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from libs.clock import Clock
from proto import subjects
from proto.events import Preempted
from proto.power import PowerCommand, PowerRefusal, PowerState
from proto.validation import describe
from proto.validation_records import revalidate_power_command

HOOK_TIMEOUT_S = 120.0  # wall seconds a power hook may take before it counts as failed


def default_boot_s() -> float:
    """The policy's resume time (Mosaic seconds), so the live nodes boot as the simulated do."""
    from libs.policy.config import PolicyConfig

    return PolicyConfig.default().resume_s


@dataclass(frozen=True)
class PowerHooks:
    """The operator's commands (shell words; the node id is in ``MOSAIC_NODE``)."""

    suspend: str = ""
    wake: str = ""

    async def run(self, action: str, node: str) -> str | None:
        """Run the hook of ``action``; None when it succeeded or there is none, else why not."""
        command = self.suspend if action == "suspend" else self.wake
        if not command:
            return None
        env = {**os.environ, "MOSAIC_NODE": node, "MOSAIC_POWER_ACTION": action}
        try:
            proc = await asyncio.create_subprocess_exec(
                *shlex.split(command),
                env=env,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            _, err = await asyncio.wait_for(proc.communicate(), HOOK_TIMEOUT_S)
        except (OSError, ValueError, TimeoutError) as exc:
            return f"{action} hook failed: {exc!r}"
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip()[-200:]
            return f"{action} hook exited {proc.returncode}: {tail}"
        return None


class NodePowerControl:
    """The power state of one node. ``changed`` is called on every change (the executor
    reports at once)."""

    def __init__(
        self,
        node: str,
        clock: Clock,
        *,
        boot_s: float,
        hooks: PowerHooks | None = None,
        changed: Callable[[], None] = lambda: None,
        announce: Callable[[], Awaitable[None]] | None = None,
        log: Any = None,
    ) -> None:
        self.node = node
        self.clock = clock
        self.boot_s = boot_s
        self.hooks = hooks or PowerHooks()
        self.changed = changed
        self.announce = announce  # publishes the state now (before a hook suspends the host)
        self.log = log
        self.state = PowerState(state="awake", since=clock.now())
        self._wake: asyncio.Task[None] | None = None

    @property
    def awake(self) -> bool:
        return self.state.state == "awake"

    def _set(self, state: PowerState) -> None:
        self.state = state
        if self.log is not None:
            self.log.info("power_state", state=state.state, since=state.since)
        self.changed()

    def _refuse(self, cmd: PowerCommand, reason: str) -> None:
        refusal = PowerRefusal(action=cmd.action, time=self.clock.now(), reason=reason)
        if self.log is not None:
            self.log.warning("power_refused", action=cmd.action, reason=reason)
        self._set(msgspec.structs.replace(self.state, refused=refusal))

    async def on_command(self, cmd: PowerCommand, busy: str | None) -> None:
        """Carry out ``cmd``; ``busy`` says what the node runs (None: nothing)."""
        if cmd.action == "suspend":
            await self._suspend(cmd, busy)
        else:
            await self._start_wake(cmd)

    async def _suspend(self, cmd: PowerCommand, busy: str | None) -> None:
        current = self.state.state
        if current in ("suspending", "asleep"):
            return
        if busy is not None:
            self._refuse(cmd, f"busy: {busy}")
            return
        await self._cancel_wake()
        before = self.state
        self._set(PowerState(state="suspending", since=self.clock.now()))
        if self.hooks.suspend and self.announce is not None:
            await self.announce()
        failure = await self.hooks.run("suspend", self.node)
        if failure is not None:
            self.state = before
            self._refuse(cmd, failure)
            return
        self._set(PowerState(state="asleep", since=self.clock.now()))

    async def _start_wake(self, cmd: PowerCommand) -> None:
        if self.state.state in ("awake", "waking"):
            return
        now = self.clock.now()
        before = self.state
        self._set(PowerState(state="waking", since=now, ready_at=now + self.boot_s))
        failure = await self.hooks.run("wake", self.node)
        if failure is not None:
            self.state = before
            self._refuse(cmd, failure)
            return
        self._wake = asyncio.create_task(self._boot(), name=f"boot:{self.node}")

    async def _boot(self) -> None:
        ready_at = self.state.ready_at or self.clock.now()
        await self.clock.sleep(ready_at - self.clock.now())
        if self.state.state == "waking":
            self._set(PowerState(state="awake", since=ready_at))

    async def _cancel_wake(self) -> None:
        task, self._wake = self._wake, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def settled(self, now: float) -> bool:
        """Stepped clock: False while a boot due by ``now`` has not made the node awake yet."""
        st = self.state
        return not (st.state == "waking" and st.ready_at is not None and st.ready_at <= now)

    def ready_at(self) -> float | None:
        """When a boot under way ends (Mosaic time), or None when the node is not waking."""
        st = self.state
        return st.ready_at if st.state == "waking" else None

    async def close(self) -> None:
        await self._cancel_wake()


class PowerHandling:
    """A mixin of ``NodeExecutor``: its answers to power commands, and to runs while asleep."""

    bus: Any
    node: Any  # NodeSpec
    log: Any
    power: NodePowerControl
    running: dict[str, Any]
    ending: dict[str, Any]
    accepted: set[tuple[str, int]]
    _finish: Callable[..., Awaitable[None]]

    async def _refuse_run(self, entry: Any) -> None:
        """A run for a node that is not awake: the attempt ends at once in ``Preempted`` (the
        job is queued again, never lost) and leaves a tombstone like any ended attempt, so a
        redelivery after the node woke does not run it behind the placer's back."""
        why = f"refused: node {self.node.id} is {self.power.state.state}"
        self.log.warning("run_refused", job_id=entry.job_id, attempt=entry.attempt, reason=why)
        self.accepted.add((entry.job_id, entry.attempt))
        ev = Preempted(
            job_id=entry.job_id,
            time=entry.started_at,
            node=self.node.id,
            reason=why,
            attempt=entry.attempt,
        )
        await self._finish(entry, (ev,))

    async def on_power(self, cmd: PowerCommand) -> None:
        """Suspend or wake (``services.executor.power``); unsound: dead-lettered."""
        errors = revalidate_power_command(cmd, self.node.id)
        if errors:
            subject = subjects.node_command(self.node.id, subjects.POWER_VERB)
            await self.bus.dead_letter(subject, msgspec.json.encode(cmd), describe(errors))
            return
        busy = sorted({*self.running, *self.ending})
        await self.power.on_command(cmd, ", ".join(busy) if busy else None)
