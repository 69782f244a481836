"""Runs one local job's command and writes its exit status to a file: the job's keeper.

``python -I wrapper.py --rc-file PATH [--checkpoint-signal SIG] [--uid N --gid N] -- COMMAND``

Why a wrapper: a job must outlive a kill -9 of the executor, and the executor that comes back is
no longer its parent, so it cannot ``wait()`` for the exit status. This process (started in a
session of its own, with the executor's user) runs ``/bin/sh -c COMMAND`` as its child with the
job's unprivileged uid/gid and no supplementary groups, waits for it, and writes the status
atomically to ``--rc-file`` (in the executor's private state directory, which the job's user
cannot write, so a job cannot forge its result). A restarted executor polls this process's pid
and reads the file.

Signals it receives (TERM, INT, HUP) are passed on to the job, and it keeps waiting, so the
status is still written when a job is stopped.

The checkpoint signal (``--checkpoint-signal``, SIGUSR1 by default in the job's spec) goes to
the whole process group, and must end neither this process nor the ``/bin/sh`` between it and
the job: either would end the attempt while the job still saves its checkpoint. So both start
with it ignored (an ignored disposition is inherited through ``exec``): the shell survives it,
and a job that installs a handler (``libs.runtime``) gets it; a job that installs none ignores
it and is stopped with SIGTERM when its grace is over. (A POSIX shell cannot ``trap`` a signal
ignored at its start: a shell script that wants it should ``exec`` its program.)

Standard library only: it is run by path with ``python -I``, without the project on
``sys.path`` and without the caller's environment.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
from types import FrameType


def write_status(path: str, status: int) -> None:
    """``status``: the exit code, or minus the signal that ended the job (Popen's convention)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{status}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="mosaic-job-wrapper")
    p.add_argument("--rc-file", required=True)
    p.add_argument("--uid", type=int, default=None)
    p.add_argument("--gid", type=int, default=None)
    p.add_argument("--checkpoint-signal", default=None)
    p.add_argument("command")
    args = p.parse_args(argv)
    drop: dict[str, object] = {}
    if args.uid is not None:
        drop = {"user": args.uid, "group": args.gid, "extra_groups": []}
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)

    # before the job starts, so a stop that comes at once cannot end this process first
    forwarded = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    for sig in forwarded:
        signal.signal(sig, forward)
    ckpt = getattr(signal, args.checkpoint_signal or "", None)
    if isinstance(ckpt, signal.Signals):
        try:
            signal.signal(ckpt, signal.SIG_IGN)  # for the shell: inherited by the fork below
        except (OSError, ValueError):  # SIGKILL, SIGSTOP: refused by validation before here
            ckpt = None
    child = subprocess.Popen(["/bin/sh", "-c", args.command], **drop)  # type: ignore[call-overload]
    if isinstance(ckpt, signal.Signals) and ckpt in forwarded:
        signal.signal(ckpt, forward)  # this process forwards it, the shell ignores it
    status = child.wait()
    write_status(args.rc_file, status)
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
