"""HTTP fuzzing with hypothesis against the real gateway on a real nats-server.

Generated requests, written byte by byte on raw sockets so nothing in a client library tidies
them up: random JSON bodies (deep nesting, 1e308, -0.0, 1e-320, NaN/Infinity literals, wrong
types, unknown fields), bytes that are not UTF-8, every method, odd content types, paths and
query strings, many and huge headers. What must hold for every one:

- no answer is >= 500;
- a refusal of a well-formed HTTP request is a 4xx with a JSON ``ErrorResponse`` (only requests
  the HTTP parser itself rejects before the app sees them, e.g. a header over 8 KB, get
  aiohttp's plain-text 400);
- a job accepted (201) passes ``revalidate_spec``: nothing unsound gets onto the bus;
- afterwards a valid job still submits and ``/healthz`` is 200.

Most requests carry the admin token (so they reach validation); some none, a wrong one or one
that is not ASCII: those are 401s, JSON too.

``make test`` runs a few hundred requests; ``-m slow`` runs 10,000 (counts in
``docs/benchmarks.md``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libs.bus.server import free_port
from proto.jobs import JobSpec
from proto.validation import JOB_FIELDS, revalidate_spec
from proto.views import ErrorResponse, SubmitResponse
from tests.services._gateway_auth import ADMIN_TOKEN, admin_token_file

# --- the gateway as its own process (hypothesis drives a plain synchronous test) ------------

ROOT = Path(__file__).resolve().parent.parent.parent


@contextmanager
def gateway_process(nats_url: str) -> Iterator[int]:
    """``python -m services.gateway`` on a free port, stopped with SIGTERM (exit code 0).

    Why a process, not a thread: it is the real entry point, and hypothesis must own the
    ``random`` module of the process that draws the examples (the gateway's tracing uses it).
    """
    port = free_port()
    env = {**os.environ, "MOSAIC_NATS_URL": nats_url, "MOSAIC_LOG_FORMAT": "json"}
    args = [sys.executable, "-m", "services.gateway", "--http-port", str(port)]
    args += ["--log-level", "error", "--admin-token-file", str(admin_token_file())]
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not _healthy(port):
            assert time.monotonic() < deadline and proc.poll() is None, "gateway did not start"
            time.sleep(0.05)
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0


def _healthy(port: int) -> bool:
    try:
        return request_bytes(port, build("GET", "/healthz")).status == 200
    except OSError:
        return False


# --- raw HTTP -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def build(
    method: str,
    target: str,
    body: bytes | None = None,
    headers: tuple[tuple[str, str], ...] = (),
    content_type: str | None = None,
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    if content_type is not None:
        lines.append(f"Content-Type: {content_type}")
    lines += [f"{k}: {v}" for k, v in headers]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")
    return head + (body or b"")


def request_bytes(port: int, data: bytes) -> Answer:
    """Send ``data``, read until the server closes; status 0 when it closed without a word.
    The server may stop reading early (a refused header) and close: what it said still counts."""
    chunks: list[bytes] = []
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        with suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(data)
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1."):
        return Answer(0, {}, head)
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return Answer(int(status_line.split()[1]), headers, body)


# --- strategies -----------------------------------------------------------------------------

EDGE_NUMBERS = [0, -1, 1, 2, 64, 65, 10**30, -(10**30), 2**63, 0.5, 0.01, 0.009, -0.0]
EDGE_NUMBERS += [1e308, -1e308, 1e-320, 5e-324, 1e-7, 3.6e9, 31536000.0, 31536001.0]
NUMBER_LITERALS = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e-400", "-0", "00"]
NUMBER_LITERALS += ["1.", ".5", "0x10", "1_0", "+1", "1e", "--1", "9" * 400]

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(EDGE_NUMBERS)
    | st.text(max_size=40)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
field_names = st.sampled_from(sorted(JOB_FIELDS)) | st.sampled_from(["gpu", "GPUS", "", "type"])
field_names |= st.text(max_size=12)
job_like = st.dictionaries(field_names, json_values, max_size=8)
# values a field expects, mostly: closer to valid jobs, so the bounds are what is tested
plausible = st.fixed_dictionaries(
    {},
    optional={
        "id": st.from_regex(r"\A[a-z0-9-]{1,20}\Z") | st.text(max_size=70),
        "tenant": st.sampled_from(["default", "vision", "x" * 65, "", "a b"]),
        "gpus": st.sampled_from([*EDGE_NUMBERS, 1, 1, 2, 4, 0.25]) | st.floats(-2, 100),
        "priority": st.integers(min_value=-2, max_value=12) | st.sampled_from([True, 2**64]),
        "gpu_mem_gb": st.sampled_from([*EDGE_NUMBERS, 8, 16]),
        "est_runtime_s": st.sampled_from([*EDGE_NUMBERS, 60, 3600]),
        "deadline": st.sampled_from([*EDGE_NUMBERS, time.time() + 3600, time.time() + 40000000.0]),
        "energy_sensitivity": st.floats(allow_nan=False, allow_infinity=False),
        "constraints": st.lists(st.sampled_from(["t4", "a100", "tpu", "", "x" * 70]), max_size=20),
        "elastic": st.fixed_dictionaries(
            {"min_gpus": st.integers(-2, 70), "max_gpus": st.integers(-2, 70)}
        ),
        "command": st.text(max_size=60) | st.just("x" * 20_000),
        "workload_class": st.sampled_from(["cnn", "quantum", 3]),
    },
)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["plausible", "job_like", "value", "literal", "deep", "bytes"]))
    if kind == "plausible":
        return json.dumps(draw(plausible)).encode()
    if kind == "job_like":
        return json.dumps(draw(job_like)).encode()
    if kind == "value":
        return json.dumps(draw(json_values)).encode()
    if kind == "literal":
        field = draw(st.sampled_from(["gpus", "est_runtime_s", "deadline", "priority", "cpus"]))
        return f'{{"id": "lit", "{field}": {draw(st.sampled_from(NUMBER_LITERALS))}}}'.encode()
    if kind == "deep":
        n = draw(st.sampled_from([10, 100, 1000, 5000, 100_000]))
        opener = draw(st.sampled_from(["[", '{"a":', '{"id": "d", "elastic": ', '{"x": [']))
        return (opener * n).encode() + b"1" + b"]" * n
    return draw(st.binary(max_size=200))  # mostly not UTF-8, rarely JSON


segment = st.sampled_from(["v1", "jobs", "nodes", "events", "decisions", "healthz", "..", "."])
segment |= st.text(alphabet=st.characters(codec="ascii", exclude_characters=" \r\n"), max_size=12)
quoted = segment.map(
    lambda s: "".join(c if c.isalnum() or c in "-_.~/" else f"%{ord(c):02X}" for c in s)
)
paths = st.sampled_from(
    ["/", "/healthz", "/metrics", "/v1/jobs", "/v1/nodes", "/v1/jobs/fuzz-1", "/v1/jobs/x/events"]
) | st.lists(quoted, min_size=1, max_size=5).map(lambda p: "/" + "/".join(p))
queries = st.sampled_from(["", "?state=pending", "?state=nope", "?tenant=", "?reason=%ff%fe"])
queries |= st.lists(st.tuples(quoted, quoted), max_size=3).map(
    lambda kv: "?" + "&".join(f"{k}={v}" for k, v in kv) if kv else ""
)
methods = st.sampled_from(["GET", "POST", "POST", "POST", "PUT", "DELETE", "PATCH", "HEAD"])
methods |= st.sampled_from(["OPTIONS", "TRACE", "FOO", "get"])
content_types = (
    st.sampled_from(
        [
            "application/json",
            "application/json; charset=utf-8",
            "application/json; charset=latin-1",
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "",
            "application/json;;;",
        ]
    )
    | st.none()
)
header_values = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=60)
extra_headers = st.lists(
    st.tuples(st.from_regex(r"\AX-[A-Za-z0-9-]{1,20}\Z"), header_values), max_size=5
)


@st.composite
def requests(draw: st.DrawFn) -> tuple[bytes, bool]:
    """(request bytes, whether it is well-formed HTTP: then the app answers and it must be
    JSON when it refuses)."""
    if draw(st.integers(0, 9)) < 4:  # a submission with a job-shaped body, as most are
        method, target, ctype = "POST", "/v1/jobs", "application/json"
        body = json.dumps(draw(plausible)).encode()
    else:
        method = draw(methods)
        target = draw(paths) + draw(queries)
        body = draw(bodies()) if method not in ("GET", "HEAD") or draw(st.booleans()) else None
        ctype = draw(content_types)
    headers = tuple(draw(extra_headers))
    token = draw(st.sampled_from([ADMIN_TOKEN] * 8 + [None, "wrong", ADMIN_TOKEN + "\u00e9"]))
    if token is not None:
        headers = (("Authorization", f"Bearer {token}"), *headers)
    well_formed = method.isupper() and method.isalpha()
    if draw(st.integers(0, 19)) == 0:  # a header the parser refuses (over 8190 bytes)
        headers += (("X-Huge", "h" * draw(st.sampled_from([8200, 20_000, 70_000]))),)
        well_formed = False
    return build(method, target, body, headers, ctype), well_formed


# --- the property ---------------------------------------------------------------------------


def check(port: int, data: bytes, well_formed: bool, counts: Counter[str]) -> None:
    answer = request_bytes(port, data)
    counts[str(answer.status)] += 1
    assert answer.status != 0 or not well_formed, data[:300]
    assert answer.status < 500, (answer, data[:300])
    method = data.split(b" ", 1)[0]
    if answer.status >= 400 and well_formed and method != b"HEAD":
        assert answer.headers.get("content-type", "").startswith("application/json"), answer
        assert msgspec.json.decode(answer.body, type=ErrorResponse).error, answer
    if answer.status == 201:
        job = msgspec.json.decode(answer.body, type=SubmitResponse).job
        assert revalidate_spec(job.spec) == [], job.spec


def fuzz(nats_url: str, examples: int) -> Counter[str]:
    counts: Counter[str] = Counter()
    with gateway_process(nats_url) as port:

        @settings(
            max_examples=examples,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(requests())
        def one(req: tuple[bytes, bool]) -> None:
            check(port, req[0], req[1], counts)

        started = time.monotonic()
        one()
        counts["seconds"] = round(time.monotonic() - started)
        valid = msgspec.json.encode(JobSpec(id="after-fuzz", gpus=1))
        auth = (("Authorization", f"Bearer {ADMIN_TOKEN}"),)
        answer = request_bytes(port, build("POST", "/v1/jobs", valid, auth, "application/json"))
        assert answer.status == 201, answer
        assert request_bytes(port, build("GET", "/healthz")).status == 200
    print(f"\nHTTP fuzz: {sum(v for k, v in counts.items() if k != 'seconds')} requests", counts)
    return counts


def test_http_fuzz_small(nats_url: str) -> None:
    counts = fuzz(nats_url, 300)
    assert not any(k.isdigit() and int(k) >= 500 for k in counts)


@pytest.mark.slow
def test_http_fuzz_10k(nats_url: str) -> None:
    counts = fuzz(nats_url, 10_000)
    assert not any(k.isdigit() and int(k) >= 500 for k in counts)
