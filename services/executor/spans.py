"""The executor's spans about an attempt: ``executor.start``, ``executor.run`` and the end
(``executor.complete``, ``.fail``, ``.cancel``, ``.checkpoint``, ``.preempt``).

Why their parent is ``RunCommand.trace`` and not the handler's span: the end of a run is
published by a timer or a process watcher minutes later, and after an executor restart by an
executor that never saw the command's headers; the command itself is journaled with the attempt,
so every span of it joins the placement that started it. Apart from ``executor.py`` so that the
executor's own logic stays what it was (``libs.obs.jobspans`` does the tracing).
"""

from __future__ import annotations

from collections.abc import Awaitable
from contextlib import AbstractContextManager

from opentelemetry import trace
from opentelemetry.trace import Span

from libs.obs.jobspans import job_span
from proto.events import LifecycleEvent, event_type
from services.executor.journal import Entry
from services.executor.runners import Outcome

TRACER = trace.get_tracer("executor")
_NAMES = {
    "started": "executor.start",
    "completed": "executor.complete",
    "failed": "executor.fail",
    "cancelled": "executor.cancel",
    "checkpointed": "executor.checkpoint",
    "preempted": "executor.preempt",
}


def event_span(event: LifecycleEvent, entry: Entry) -> AbstractContextManager[Span]:
    """The span around publishing ``event`` of ``entry``'s attempt, in its placement's trace."""
    kind = event_type(event)
    return job_span(
        TRACER,
        _NAMES.get(kind, f"executor.{kind}"),
        entry.cmd.trace,
        job=event.job_id,
        attempt=entry.attempt,
        node=entry.node,
        reason=event.reason or None,
    )


async def traced_run(entry: Entry, wait: Awaitable[Outcome]) -> Outcome:
    """Await the runner's ``wait`` inside ``executor.run`` (from the start of the attempt, or
    its adoption by a restarted executor, to its end), marked with how it ended."""
    attrs = {"job": entry.job_id, "attempt": entry.attempt, "node": entry.node}
    with job_span(TRACER, "executor.run", entry.cmd.trace, **attrs) as span:
        outcome = await wait
        span.set_attribute("ok", outcome.ok)
        if not outcome.ok:
            span.set_attribute("reason", outcome.reason)
        return outcome
