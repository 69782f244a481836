"""Create (or bring up to date) every stream and KV bucket of ``proto.subjects``, bounded.

Why retention here and not left to the server's defaults: a JetStream stream without limits grows
with every job forever (issue 12: about 3.7 KB per job, every restart replaying all of it). Each
stream and bucket gets the limits ``proto.subjects`` documents, unless the operator overrides them
through the environment:

- ``MOSAIC_STREAM_<NAME>_MAX_AGE_S`` (seconds, 0 = none), ``MOSAIC_STREAM_<NAME>_MAX_BYTES``
  (a size such as ``2GiB``, -1 = none), ``MOSAIC_STREAM_<NAME>_MAX_MSGS`` (-1 = none);
- ``MOSAIC_KV_<BUCKET>_MAX_BYTES`` (bucket name upper-cased, ``-`` as ``_``).

A stream or bucket created by an older version (unbounded) is updated in place; its messages are
kept, except what the new limits discard (oldest first).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

import nats.js.errors
from nats.js import api
from nats.js.client import JetStreamContext

from libs.bus.errors import BusError
from libs.bus.limits import parse_size
from proto import subjects
from proto.subjects import StreamLimits

DUPLICATE_WINDOW_S = 600.0  # Nats-Msg-Id dedupe horizon: a retry within 10 min is dropped
# err_code of "stream name already in use with a different configuration"
_STREAM_NAME_IN_USE = 10058
# err_codes of "insufficient (storage) resources": the server reserves every max_bytes up front
_NO_ROOM = (10023, 10047)


def _env_name(name: str) -> str:
    return re.sub(r"[^A-Z0-9]", "_", name.upper())


def stream_limits(name: str, env: Mapping[str, str] | None = None) -> StreamLimits:
    """The limits of stream ``name``: its default in ``proto.subjects``, then the environment."""
    env = os.environ if env is None else env
    base = subjects.STREAM_LIMITS.get(name, subjects.STREAM_DEFAULT_LIMITS)
    prefix = f"MOSAIC_STREAM_{_env_name(name)}_"
    age = env.get(prefix + "MAX_AGE_S")
    size = env.get(prefix + "MAX_BYTES")
    count = env.get(prefix + "MAX_MSGS")
    limits = StreamLimits(
        max_age_s=float(age) if age else base.max_age_s,
        max_bytes=parse_size(size) if size else base.max_bytes,
        max_msgs=int(count) if count else base.max_msgs,
    )
    if limits.max_age_s < 0 or limits.max_bytes < -1 or limits.max_msgs < -1:
        raise ValueError(f"stream {name}: bad limits {limits} (from {prefix}*)")
    return limits


def bucket_max_bytes(bucket: str, env: Mapping[str, str] | None = None) -> int:
    """The size limit of KV ``bucket``: its default, then ``MOSAIC_KV_<BUCKET>_MAX_BYTES``."""
    env = os.environ if env is None else env
    var = f"MOSAIC_KV_{_env_name(bucket)}_MAX_BYTES"
    value = parse_size(env[var]) if env.get(var) else subjects.kv_max_bytes(bucket)
    if value < -1 or value == 0:
        raise ValueError(f"{var}: a bucket size must be > 0 or -1, got {value}")
    return value


def stream_replicas() -> int:
    """Replicas of every stream and bucket: ``MOSAIC_STREAM_REPLICAS`` (3 on a three-server
    JetStream cluster, so losing one server loses nothing), else 1. Every service must agree,
    or the second to start finds a config that differs."""
    raw = os.environ.get("MOSAIC_STREAM_REPLICAS", "") or "1"
    try:
        return max(1, int(raw))
    except ValueError:
        raise ValueError(f"MOSAIC_STREAM_REPLICAS must be an integer, got {raw!r}") from None


def stream_config(name: str, subs: tuple[str, ...], limits: StreamLimits) -> api.StreamConfig:
    return api.StreamConfig(
        name=name,
        subjects=list(subs),
        storage=api.StorageType.FILE,
        num_replicas=stream_replicas(),
        retention=api.RetentionPolicy.LIMITS,
        discard=api.DiscardPolicy.OLD,
        duplicate_window=DUPLICATE_WINDOW_S,
        max_age=limits.max_age_s or None,
        max_bytes=limits.max_bytes,
        max_msgs=limits.max_msgs,
    )


def _no_room(kind: str, name: str, size: int, var: str, exc: BaseException) -> BusError:
    return BusError(
        f"JetStream has no room for {kind} {name} (max_bytes {size}): the server reserves every "
        f"limit up front; lower {var} or give the server a larger store ({exc})"
    )


async def ensure_topology(
    js: JetStreamContext, log: Any, env: Mapping[str, str] | None = None
) -> None:
    """Create every stream and KV bucket, with limits; see the module docstring.

    Idempotent and safe when several services race: the server accepts a create with a config
    identical to the existing one.
    """
    for name, subs in subjects.STREAMS.items():
        await _ensure_stream(js, log, name, subs, stream_limits(name, env))
    for bucket in subjects.KV_BUCKETS:
        await _ensure_bucket(js, log, bucket, bucket_max_bytes(bucket, env))


async def _ensure_stream(
    js: JetStreamContext, log: Any, name: str, subs: tuple[str, ...], limits: StreamLimits
) -> None:
    config = stream_config(name, subs, limits)
    try:
        await js.add_stream(config)
        return
    except nats.js.errors.APIError as exc:
        if exc.err_code in _NO_ROOM:
            var = f"MOSAIC_STREAM_{_env_name(name)}_MAX_BYTES"
            raise _no_room("stream", name, limits.max_bytes, var, exc) from exc
        if exc.err_code != _STREAM_NAME_IN_USE:
            raise
    try:
        await js.update_stream(config)
        log.info("stream_updated", stream=name, limits=str(limits))
    except nats.js.errors.APIError as upd:
        log.warning("stream_config_differs", stream=name, error=str(upd))


async def _ensure_bucket(js: JetStreamContext, log: Any, bucket: str, max_bytes: int) -> None:
    try:
        await js.create_key_value(
            bucket=bucket,
            history=1,
            storage=api.StorageType.FILE,
            max_bytes=max_bytes,
            replicas=stream_replicas(),
        )
        return
    except nats.js.errors.APIError as exc:
        if exc.err_code in _NO_ROOM:
            var = f"MOSAIC_KV_{_env_name(bucket)}_MAX_BYTES"
            raise _no_room("KV bucket", bucket, max_bytes, var, exc) from exc
        if exc.err_code != _STREAM_NAME_IN_USE:
            raise
    # an older bucket (unbounded, other limits, or one replica from a single server now a
    # member of a cluster): change only its size limit and replicas, in place
    stream = f"KV_{bucket}"
    replicas = stream_replicas()
    try:
        info = await js.stream_info(stream)
        if info.config.max_bytes != max_bytes or (info.config.num_replicas or 1) != replicas:
            new = dataclasses.replace(info.config, max_bytes=max_bytes, num_replicas=replicas)
            await js.update_stream(new)
            log.info("bucket_updated", bucket=bucket, max_bytes=max_bytes, replicas=replicas)
    except nats.js.errors.APIError as upd:
        log.warning("bucket_config_differs", bucket=bucket, error=str(upd))
