"""A job producer on the bus: publish ``JobSpec``s on ``jobs.submit`` and cancels on
``jobs.cancel``, as the NATS user ``producer`` (docs/runtime-contract.md, "Producers on the bus").

Why beside the HTTP client (``libs.client.api``): a pipeline that already speaks NATS (a data
pipeline, a CI system, a notebook farm) can hand jobs over durably while the gateway is down or
restarting: JetStream keeps the message and the gateway's durable consumer takes it when it is
back. What it gives up: the answer. A publish is acknowledged by the stream, not judged by the
gateway; a refusal shows up on the job's lifecycle (``GET /v1/jobs/<id>``: ``failed``,
``Refused: <field>: <reason>``), an undecodable message on ``dlq.gateway``.

    async with await Producer.connect(credentials=".mosaic/credentials/producer.json") as p:
        new = await p.submit(JobSpec(id="train-42", gpus=2, est_runtime_s=7200))
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from libs.bus.auth import PRODUCER, inbox_prefix, load_connect_options
from libs.bus.connection import Bus
from libs.client.credentials import PRODUCER_FILE, credentials_dir_of
from proto import subjects
from proto.jobs import CancelRequest, JobSpec
from proto.validation import sound_id

DEFAULT_URL = "nats://127.0.0.1:4222"
DEFAULT_DATA_DIR = ".mosaic"


def find_credentials(data_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """``producer.json`` of a ``mosaic up`` data dir (``data_dir``, else ``MOSAIC_DATA_DIR``,
    else ``.mosaic``): the folder its ``stack.json`` names, else ``<data dir>/credentials``.
    None when there is none (a server without authentication)."""
    root = Path(data_dir or os.environ.get("MOSAIC_DATA_DIR") or DEFAULT_DATA_DIR)
    for folder in (credentials_dir_of(root), root / "credentials"):
        if folder is not None and (folder / PRODUCER_FILE).is_file():
            return folder / PRODUCER_FILE
    return None


def connect_options(
    *,
    user: str | None = None,
    password: str | None = None,
    credentials: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """``nats.connect`` keyword arguments: ``user``/``password`` when given, else the
    credentials file (``credentials``, else the one ``find_credentials`` finds), else none."""
    if user is not None:
        return {"user": user, "password": password or "", "inbox_prefix": inbox_prefix(user)}
    path = credentials or find_credentials(data_dir)
    return load_connect_options(path) if path is not None else {}


class Producer:
    """Submits and cancels jobs over NATS. One connection; ``close`` (or ``async with``) ends it."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    @classmethod
    async def connect(
        cls,
        url: str | None = None,
        *,
        user: str | None = None,
        password: str | None = None,
        credentials: str | os.PathLike[str] | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        attempts: int = 5,
    ) -> Producer:
        """Connect as ``user`` (the deployments' producer user is ``producer``) or with a
        credentials file (``DATA_DIR/credentials/producer.json`` of ``mosaic up``). ``url``
        defaults to the file's servers, else ``nats://127.0.0.1:4222``."""
        options = connect_options(
            user=user, password=password, credentials=credentials, data_dir=data_dir
        )
        servers = options.get("servers")
        if url is None and servers:
            url = ",".join(servers) if isinstance(servers, list) else str(servers)
        bus = await Bus.connect(url or DEFAULT_URL, PRODUCER, attempts=attempts, **options)
        return cls(bus)

    async def submit(self, spec: JobSpec) -> bool:
        """Publish ``spec`` on ``jobs.submit`` with ``Nats-Msg-Id`` = its id; True when the
        stream took it as new, False for a repeat within the stream's duplicate window (2 min).
        Either way the gateway makes at most one job of an id, so a retry after an error or a
        timeout is always safe. The job's fate (pending, or failed with ``Refused: ...``) is on
        its lifecycle and ``GET /v1/jobs/<id>``. Raises ``ValueError`` for an id that is no id
        (the gateway could not answer on it: it would only be dead-lettered)."""
        if not sound_id(spec.id):
            raise ValueError(f"job id {spec.id!r}: must be 1-64 of letters, digits, '-' or '_'")
        return await self.bus.publish(subjects.SUBJECT_SUBMIT, spec, msg_id=spec.id)

    async def cancel(self, job_id: str, reason: str = "cancelled by producer") -> bool:
        """Ask for ``job_id`` to be cancelled (``jobs.cancel``, message id ``cancel-<id>``, as
        the gateway's); True when new to the stream. The placer ends it ``Cancelled``."""
        if not sound_id(job_id):
            raise ValueError(f"job id {job_id!r}: must be 1-64 of letters, digits, '-' or '_'")
        req = CancelRequest(job_id=job_id, reason=reason, time=time.time())
        return await self.bus.publish(subjects.SUBJECT_CANCEL, req, msg_id=f"cancel-{job_id}")

    async def close(self) -> None:
        await self.bus.close()

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
