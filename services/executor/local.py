"""Local mode: each job's ``spec.command`` as a process that outlives the executor."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

from proto.nodes import NodeSpec
from services.executor.journal import Entry, Launch, file_stem, job_stem
from services.executor.progress import PROGRESS_FILE, read_progress
from services.executor.runners import CheckpointEnd, Outcome, StartFailed
from services.executor.share_env import share_env

KILL_GRACE_S = 10.0  # wall seconds between SIGTERM and SIGKILL of a local job
POLL_S = 0.2  # wall seconds between two looks at whether a job's process has ended
WRAPPER = Path(__file__).with_name("wrapper.py")
PATH = "/usr/bin:/bin"
LOST = "lost: executor restarted and the process was gone"


@dataclass(frozen=True)
class RunAs:
    """The unprivileged user jobs run as; ``switch`` is False when it is the executor's own."""

    name: str
    uid: int
    gid: int
    switch: bool

    @classmethod
    def resolve(cls, name: str | None) -> RunAs:
        """``name`` (a user name or uid), else ``nobody`` when the executor is root, else the
        executor's own user. Refuses another user when not root (it could not switch)."""
        euid = os.geteuid()
        if not name:
            name = "nobody" if euid == 0 else str(euid)
        try:
            pw = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
        except KeyError:
            raise ValueError(f"run-as user {name!r} does not exist") from None
        switch = pw.pw_uid != euid
        if switch and euid != 0:
            raise ValueError(f"run-as user {pw.pw_name!r}: only root can run jobs as another user")
        if switch and pw.pw_uid == 0:
            raise ValueError("run-as user is root: jobs must not run with the executor's rights")
        return cls(name=pw.pw_name, uid=pw.pw_uid, gid=pw.pw_gid, switch=switch)


def proc_start_ticks(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time in clock ticks since boot), or None when no
    such process runs (a zombie counts as ended: its status is in the rc file already)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the name in (...) may hold spaces
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def alive(launch: Launch) -> bool:
    return proc_start_ticks(launch.pid) == launch.start_ticks


def find_wrapper(rc_path: Path) -> int | None:
    """The pid of the wrapper writing ``rc_path``, found by its command line: how a restart
    finds a process started just before a crash, before its pid reached the journal."""
    needle = os.fsencode(str(rc_path))
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if str(WRAPPER).encode() in argv and needle in argv:
                return int(proc.name)
    return None


def read_status(rc_path: Path) -> int | None:
    try:
        return int(rc_path.read_text().strip())
    except (OSError, ValueError):
        return None


class LocalRunner:
    """Runs ``spec.command`` through ``/bin/sh`` as ``run_as``, with ``CUDA_VISIBLE_DEVICES`` =
    the allocated GPUs, under a wrapper (``services/executor/wrapper.py``) in its own session.

    What is isolated: the job runs as an unprivileged user (uid, primary gid, no supplementary
    groups; never root), with only an allow-listed environment (``PATH=/usr/bin:/bin``, ``HOME``
    = its working directory, ``LANG``, ``USER``/``LOGNAME``, its ``MOSAIC_*`` job variables and
    ``CUDA_VISIBLE_DEVICES``; the checkpoint protocol's ``MOSAIC_RESUME_PROGRESS``,
    ``MOSAIC_CHECKPOINT_DIR``, ``MOSAIC_PROGRESS_FILE``, ``MOSAIC_CHECKPOINT_SIGNAL`` and
    ``MOSAIC_CHECKPOINT_GRACE_S``; the GPU share's ``services.executor.share_env``), never the
    executor's (which may hold NATS credentials),
    stdin from /dev/null and no inherited file descriptors but its log. It works in a directory
    of its own (``<work_root>/<job>-<attempt>``, mode 0700, owned by that user); its exit status
    goes to the executor's private state directory, which it cannot write.
    What is NOT isolated: no cgroups (CPU, memory, pids are not limited; ``CUDA_VISIBLE_DEVICES``
    is a convention a job can ignore, not a device fence), no network isolation (it reaches
    whatever the node reaches, NATS included: only credentials keep it out), no filesystem or pid
    namespace (it can read what ``run_as`` may read), and all jobs of one node share ``run_as``,
    so they can signal one another. Use containers (Kubernetes) where that matters.

    Output goes to ``<log_dir>/<job>-<attempt>.log``, opened by the executor (it stays readable
    by the executor, whoever the job runs as); a non-zero exit fails the job with the last line
    of that log in the reason. ``stop`` terminates the process group: SIGTERM, then SIGKILL after
    ``KILL_GRACE_S``. ``checkpoint`` sends the job's checkpoint signal to the process group
    and waits its grace before that (``services.executor.checkpoint``). Each job has one
    checkpoint directory for all its attempts, ``<checkpoint_root>/<job>`` (default root
    ``<work_root>/checkpoints``; point it at shared storage for attempts on other nodes).
    """

    outlives_executor = True

    def __init__(
        self,
        log_dir: Path,
        work_root: Path,
        run_as: RunAs,
        extra_env: dict[str, str] | None = None,
        checkpoint_root: Path | None = None,
    ) -> None:
        self.log_dir = log_dir
        self.work_root = work_root
        self.checkpoint_root = checkpoint_root or work_root / "checkpoints"
        self.run_as = run_as
        self.extra_env = dict(extra_env or {})
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def job_env(self, entry: Entry, node: NodeSpec, work_dir: Path) -> dict[str, str]:
        """The whole environment of the job: an allow-list, nothing inherited."""
        alloc = entry.cmd.allocation
        spec = alloc.spec
        return {
            "PATH": PATH,
            "HOME": str(work_dir),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "USER": self.run_as.name,
            "LOGNAME": self.run_as.name,
            **self.extra_env,
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in alloc.gpu_indices),
            "MOSAIC_JOB_ID": alloc.job_id,
            "MOSAIC_ATTEMPT": str(alloc.attempt),
            "MOSAIC_PROGRESS": repr(entry.cmd.progress),
            "MOSAIC_NODE": node.id,
            "MOSAIC_WORK_DIR": str(work_dir),
            "MOSAIC_RESUME_PROGRESS": repr(entry.cmd.progress),
            "MOSAIC_CHECKPOINT_DIR": str(self.checkpoint_dir(entry.job_id)),
            "MOSAIC_PROGRESS_FILE": str(work_dir / PROGRESS_FILE),
            "MOSAIC_CHECKPOINT_SIGNAL": spec.checkpoint_signal if spec else "SIGUSR1",
            "MOSAIC_CHECKPOINT_GRACE_S": repr(spec.checkpoint_grace_s if spec else 30.0),
            **share_env(alloc, node, self.extra_env),  # the GPU share (services.executor.share_env)
        }

    def checkpoint_dir(self, job_id: str) -> Path:
        return self.checkpoint_root / job_stem(job_id)

    def _job_dir(self, path: Path) -> None:
        """A directory only the job's user may use (created by the executor, given to it)."""
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.run_as.switch:
            os.chown(path, self.run_as.uid, self.run_as.gid)

    async def start(self, entry: Entry, node: NodeSpec, rc_path: Path) -> Launch | None:
        spec = entry.cmd.allocation.spec
        if spec is None or not spec.command:
            raise StartFailed("local mode: the job has no command to run")
        stem = file_stem(entry.job_id, entry.attempt)
        work_dir = self.work_root / stem
        self._job_dir(work_dir)
        self.checkpoint_root.mkdir(mode=0o711, parents=True, exist_ok=True)
        self._job_dir(self.checkpoint_dir(entry.job_id))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{stem}.log"
        drop = ["--uid", str(self.run_as.uid), "--gid", str(self.run_as.gid)]
        argv = [sys.executable, "-I", str(WRAPPER), "--rc-file", str(rc_path)]
        argv += ["--checkpoint-signal", spec.checkpoint_signal]
        argv += [*(drop if self.run_as.switch else []), "--", spec.command]
        with contextlib.suppress(FileNotFoundError):
            rc_path.unlink()  # a stale status from an earlier try must not be read as this one's
        # O_NOFOLLOW: a log directory that someone else can write must not let a planted
        # symlink turn this (privileged) open into a write elsewhere
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        with open(os.open(log_path, flags, 0o640), "ab") as log:
            # plain Popen, not asyncio's: an asyncio subprocess transport kills its process
            # when it is closed or collected, and this one must outlive the executor
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.job_env(entry, node, work_dir),
                cwd=work_dir,
                start_new_session=True,  # outlives the executor; one process group to stop
            )
        self._children[proc.pid] = proc
        ticks = proc_start_ticks(proc.pid)
        return Launch(
            pid=proc.pid,
            start_ticks=ticks if ticks is not None else -1,
            rc_path=str(rc_path),
            log_path=str(log_path),
            work_dir=str(work_dir),
        )

    def adopt(self, entry: Entry, rc_path: Path) -> Entry:
        """An entry from the journal whose pid never got there: find its wrapper by its
        command line, or its status file if it has ended. Else the entry stays without a
        launch: the executor starts it if the journal has it as not started yet (a crash before the
        process started), or ``wait`` reports it lost."""
        if entry.launch is not None:
            return entry
        pid = find_wrapper(rc_path)
        ticks = proc_start_ticks(pid) if pid is not None else None
        if pid is None or ticks is None:
            if read_status(rc_path) is None:
                return entry
            pid, ticks = 0, -2  # ended already; its status is on disk
        stem = file_stem(entry.job_id, entry.attempt)
        launch = Launch(
            pid=pid,
            start_ticks=ticks,
            rc_path=str(rc_path),
            log_path=str(self.log_dir / f"{stem}.log"),
            work_dir=str(self.work_root / stem),
        )
        return msgspec.structs.replace(entry, launch=launch)

    async def wait(self, entry: Entry, node: NodeSpec) -> Outcome:
        launch = entry.launch
        if launch is None:
            return Outcome(False, LOST)
        child = self._children.get(launch.pid)
        if child is not None:
            while child.poll() is None:  # reaps it once it has ended
                await asyncio.sleep(POLL_S)
            self._children.pop(launch.pid, None)
        else:
            while alive(launch):
                await asyncio.sleep(POLL_S)
        status = read_status(Path(launch.rc_path))
        if status is None:
            if child is None:
                return Outcome(False, LOST)
            return Outcome(False, f"lost: the job's wrapper ended with {child.returncode}")
        if status == 0:
            return Outcome(True)
        what = f"exit code {status}" if status > 0 else f"killed by signal {-status}"
        return Outcome(False, f"{what}: {_last_line(Path(launch.log_path))}".rstrip(": "))

    async def stop(self, entry: Entry) -> None:
        """SIGTERM to the job's process group, SIGKILL after ``KILL_GRACE_S``; only when its
        wrapper is the process the journal names (a reused pid is left alone).

        The group, not only the wrapper, is waited for: a job that ignores SIGTERM outlives
        the shell and the wrapper that SIGTERM ends (the wrapper then writes its status and
        exits), and would hold its GPUs unseen. Its pid cannot be reused as a group id while
        any member of the group lives, so signalling the group until it is empty is safe."""
        launch = entry.launch
        if launch is None or launch.pid <= 0 or not alive(launch):
            self._reap(launch)
            return
        for sig, grace_s in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 5.0)):
            if not self._group_alive(launch):
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(launch.pid, sig)
            deadline = time.monotonic() + grace_s
            while self._group_alive(launch) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        self._reap(launch)

    def _group_alive(self, launch: Launch) -> bool:
        child = self._children.get(launch.pid)
        if child is not None:
            child.poll()  # a zombie wrapper still counts as a member of its group
        try:
            os.killpg(launch.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def _reap(self, launch: Launch | None) -> None:
        child = self._children.pop(launch.pid, None) if launch is not None else None
        if child is not None:
            child.poll()  # reap it (it is gone, or SIGKILL is on its way)

    async def checkpoint(self, entry: Entry) -> CheckpointEnd:
        """Send the checkpoint signal to the job's process group (again after an executor
        restart: a job must treat repeats as one), wait until it exits or its grace ends, then
        ``stop`` it (SIGTERM, SIGKILL) if it has not, and read its last progress record.

        A job that ended while no executor watched (it saved and exited during a restart) is
        not signalled: its status and its progress file say how it ended."""
        ck, launch = entry.checkpoint, entry.launch
        assert ck is not None
        stem = file_stem(entry.job_id, entry.attempt)
        work_dir = Path(launch.work_dir) if launch is not None else self.work_root / stem
        in_grace = True
        if launch is not None and launch.pid > 0:
            if alive(launch) and time.time() < ck.grace_until:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(launch.pid, getattr(signal, ck.signal))
            while alive(launch) and time.time() < ck.grace_until:
                await asyncio.sleep(POLL_S)
            in_grace = not alive(launch)
            await self.stop(entry)
        status = read_status(Path(launch.rc_path)) if launch is not None else None
        report = read_progress(work_dir / PROGRESS_FILE)
        return CheckpointEnd(report=report, status=status, in_grace=in_grace)


def _last_line(path: Path, max_chars: int = 300) -> str:
    try:
        lines = path.read_bytes()[-4096:].decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][:max_chars] if lines else ""
