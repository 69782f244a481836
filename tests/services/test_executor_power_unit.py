"""The executor's power state machine without NATS (``services.executor.power``): repeats are
no-ops, a busy suspend is refused, the operator's hooks decide, a boot ends at ``ready_at``."""

from __future__ import annotations

import asyncio
import sys

from libs.clock import SteppedClock
from proto.power import PowerCommand
from services.executor.power import NodePowerControl, PowerHooks


def cmd(action: str, t: float = 0.0) -> PowerCommand:
    return PowerCommand(node="n1", action=action, time=t)  # type: ignore[arg-type]


async def test_states_repeats_and_boot_on_a_stepped_clock() -> None:
    clock = SteppedClock(epoch=0.0)
    changes: list[str] = []
    p = NodePowerControl("n1", clock, boot_s=50.0)
    p.changed = lambda: changes.append(p.state.state)
    await p.on_command(cmd("suspend"), busy=None)
    assert p.state.state == "asleep"
    await p.on_command(cmd("suspend"), busy=None)  # a redelivery: nothing
    assert changes == ["suspending", "asleep"]
    clock.advance(1, 10.0)
    await p.on_command(cmd("wake"), busy=None)
    assert (p.state.state, p.state.ready_at) == ("waking", 60.0)
    await p.on_command(cmd("wake"), busy=None)  # again: still one boot
    assert not p.settled(60.0) and p.settled(59.0)
    clock.advance(2, 75.0)
    for _ in range(3):
        await asyncio.sleep(0)
    assert (p.state.state, p.state.since) == ("awake", 60.0)
    await p.close()


async def test_a_busy_node_refuses_and_keeps_awake() -> None:
    p = NodePowerControl("n1", SteppedClock(epoch=5.0), boot_s=1.0)
    await p.on_command(cmd("suspend"), busy="j1")
    assert p.state.state == "awake"
    assert p.state.refused is not None and p.state.refused.reason == "busy: j1"


async def test_hooks_run_and_a_failing_one_refuses() -> None:
    ok = PowerHooks(suspend=f"{sys.executable} -c pass", wake=f"{sys.executable} -c 'exit(3)'")
    p = NodePowerControl("n1", SteppedClock(epoch=0.0), boot_s=1.0, hooks=ok)
    await p.on_command(cmd("suspend"), busy=None)
    assert p.state.state == "asleep"
    await p.on_command(cmd("wake"), busy=None)
    assert p.state.state == "asleep"  # the wake hook failed: still asleep
    assert p.state.refused is not None and "exited 3" in p.state.refused.reason


async def test_hooks_see_the_node_and_action(tmp_path) -> None:
    out = tmp_path / "hook.txt"
    script = tmp_path / "hook.py"
    script.write_text(
        "import os, sys\n"
        "open(sys.argv[1], 'w').write(os.environ['MOSAIC_NODE'] + ' '"
        " + os.environ['MOSAIC_POWER_ACTION'])\n"
    )
    hooks = PowerHooks(suspend=f"{sys.executable} {script} {out}")
    announced: list[tuple[str, bool]] = []

    async def announce() -> None:  # the executor publishes its report here
        announced.append((p.state.state, out.exists()))

    p = NodePowerControl("n1", SteppedClock(epoch=0.0), boot_s=1.0, hooks=hooks, announce=announce)
    await p.on_command(cmd("suspend"), busy=None)
    assert out.read_text() == "n1 suspend"
    assert announced == [("suspending", False)]  # told before the hook ran
