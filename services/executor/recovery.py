"""A restarted executor takes its node's attempts back from the journal. A mixin of
``NodeExecutor``, run by ``start`` before it consumes a command: a redelivered run command must
find its attempt already adopted, so no attempt runs twice.

Per journaled attempt: one that had ended only re-publishes its pending events (JetStream drops
the repeats); one that was checkpointing finishes its checkpoint and runs nothing; a gang part
still at its start barrier goes back to it; any other is adopted by the runner (a simulated run
resumes for the Mosaic time it had left, a local process is polled until it exits) and
launched again. An unreadable entry is logged and left (``executor`` module docstring, known
limits).
"""

from __future__ import annotations

from typing import Any


class Recovery:
    """The ``NodeExecutor`` side (see the module docstring)."""

    journal: Any
    log: Any
    accepted: set[tuple[str, int]]
    runner: Any

    async def recover(self) -> None:
        """Re-adopt every journaled attempt (module docstring), before any command is taken."""
        self.journal.prune_done()
        entries, bad = self.journal.load()
        for path, why in bad:
            self.log.error("journal_entry_unreadable", path=str(path), error=why)
        for entry in entries:
            self.accepted.add((entry.job_id, entry.attempt))
            if entry.pending:  # it had ended: only its events may not be out yet
                await self._finish(entry, entry.pending)
                continue
            entry = self.runner.adopt(entry, self.journal.rc_path(entry.job_id, entry.attempt))
            if entry.checkpoint is not None:  # it was checkpointing: finish that, run nothing
                self.resume_checkpoint(entry)
                continue
            if entry.cmd.gang and not entry.started_sent:  # a gang part still at its barrier
                self.gang_start(entry)
                continue
            if entry.cmd.gang:
                await self._gang_open(entry, "running")
            self.log.info(
                "job_adopted",
                job_id=entry.job_id,
                attempt=entry.attempt,
                pid=entry.launch.pid if entry.launch else None,
                from_boot=entry.boot_id,
            )
            await self._launch(entry)
