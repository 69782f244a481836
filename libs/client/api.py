"""The job-producer SDK: a small synchronous client of the gateway's HTTP API.

Why the standard library (``urllib``) and not aiohttp: a producer script or the CLI makes one
request at a time and should not need an event loop. Answers decode into the same
``proto.views`` Structs the gateway encodes, so a contract change breaks both sides alike.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, TypeVar

import msgspec

from proto.cordons import CordonState
from proto.inference import InferenceService
from proto.jobs import JobSpec
from proto.profiles import ProfilesListing
from proto.service_views import ServicesListing, ServiceView
from proto.tenants import TenantCreated, TenantList, TenantView
from proto.validation import FieldError
from proto.views import ErrorResponse, JobView, NodeView, SubmitResponse

DEFAULT_GATEWAY = "http://127.0.0.1:8080"
T = TypeVar("T")


class ClientError(Exception):
    """The gateway answered with an error. ``errors`` are its field reasons, if any."""

    def __init__(self, status: int, error: str, errors: tuple[FieldError, ...] = ()):
        self.status = status
        self.error = error
        self.errors = errors
        super().__init__(self.one_line())

    def one_line(self) -> str:
        if self.errors:
            return "; ".join(f"{e.field}: {e.reason}" for e in self.errors)
        return f"{self.error} (HTTP {self.status})"


class GatewayUnreachable(ClientError):
    """No gateway listens at the URL (or it stopped answering)."""

    def __init__(self, url: str, detail: str):
        self.url = url
        super().__init__(0, f"gateway not reachable at {url} (is `mosaic up` running?): {detail}")

    def one_line(self) -> str:
        return self.error


class _Jobs(msgspec.Struct):
    jobs: list[JobView]


class _Nodes(msgspec.Struct):
    nodes: list[NodeView]


class MosaicClient:
    """``MosaicClient("http://127.0.0.1:8080", token=...).submit(JobSpec(id="j1", gpus=2))``.

    ``token`` is sent as ``Authorization: Bearer``; without one only ``health()`` answers
    (``libs.client.tokens.find_token`` finds the token a CLI on this machine would use)."""

    def __init__(
        self, base_url: str = DEFAULT_GATEWAY, *, token: str | None = None, timeout_s: float = 10.0
    ):
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    # --- the API ---------------------------------------------------------------------------
    def submit(self, spec: JobSpec | dict[str, Any]) -> SubmitResponse:
        """Submit a job. ``spec`` may omit ``id`` (as a dict): the gateway assigns one."""
        body = msgspec.json.encode(spec)
        if isinstance(spec, JobSpec) and not spec.id:
            body = msgspec.json.encode(
                {k: v for k, v in msgspec.to_builtins(spec).items() if k != "id"}
            )
        return self._call("POST", "/v1/jobs", SubmitResponse, body=body)

    def submit_raw(self, body: bytes) -> SubmitResponse:
        """POST bytes as they are (tests of the gateway's refusals use this)."""
        return self._call("POST", "/v1/jobs", SubmitResponse, body=body)

    def jobs(self, state: str | None = None) -> list[JobView]:
        path = "/v1/jobs" + (f"?{urllib.parse.urlencode({'state': state})}" if state else "")
        return self._call("GET", path, _Jobs).jobs

    def job(self, job_id: str) -> JobView:
        return self._call("GET", f"/v1/jobs/{urllib.parse.quote(job_id, safe='')}", JobView)

    def cancel(self, job_id: str) -> dict[str, Any]:
        path = f"/v1/jobs/{urllib.parse.quote(job_id, safe='')}"
        return self._call("DELETE", path, dict)

    def nodes(self) -> list[NodeView]:
        return self._call("GET", "/v1/nodes", _Nodes).nodes

    def profiles(self) -> ProfilesListing:
        """The profile table the scheduler uses, each entry with where it came from."""
        return self._call("GET", "/v1/profiles", ProfilesListing)

    def cordon(self, node: str, reason: str = "") -> CordonState:
        """Admin only: place nothing new on ``node`` (its running jobs stay)."""
        body = msgspec.json.encode({"reason": reason})
        path = f"/v1/nodes/{urllib.parse.quote(node, safe='')}/cordon"
        return self._call("POST", path, CordonState, body=body)

    def uncordon(self, node: str) -> CordonState:
        """Admin only: lift the operator's cordon (a label cordon stays: see ``label``)."""
        path = f"/v1/nodes/{urllib.parse.quote(node, safe='')}/uncordon"
        return self._call("POST", path, CordonState)

    def services(self) -> list[ServiceView]:
        """The inference services the caller may see, each with replicas, load and reason."""
        return list(self._call("GET", "/v1/services", ServicesListing).services)

    def apply_service(self, svc: InferenceService | dict[str, Any] | bytes) -> ServiceView:
        """Define or redefine a service (its replicas are the scaler's from then on)."""
        body = svc if isinstance(svc, bytes) else msgspec.json.encode(svc)
        return self._call("POST", "/v1/services", ServiceView, body=body)

    def remove_service(self, service_id: str) -> dict[str, Any]:
        """Remove a service: the placer stops its replicas."""
        path = f"/v1/services/{urllib.parse.quote(service_id, safe='')}"
        return self._call("DELETE", path, dict)

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/healthz", dict)

    def create_tenant(self, name: str, *, may_run_commands: bool = False) -> TenantCreated:
        """Admin only: a new tenant and its token (shown this once)."""
        body = msgspec.json.encode({"name": name, "may_run_commands": may_run_commands})
        return self._call("POST", "/v1/tenants", TenantCreated, body=body)

    def tenants(self) -> list[TenantView]:
        """Admin only: every tenant, without tokens."""
        return self._call("GET", "/v1/tenants", TenantList).tenants

    def delete_tenant(self, name: str) -> dict[str, Any]:
        """Admin only: revoke the tenant's token (its jobs stay)."""
        return self._call("DELETE", f"/v1/tenants/{urllib.parse.quote(name, safe='')}", dict)

    def get_json(self, path: str) -> Any:
        """Any other route of the gateway (events, decisions...) as plain JSON."""
        return self._call("GET", path, object)

    # --- transport -------------------------------------------------------------------------
    def _call(self, method: str, path: str, type_: type[T], *, body: bytes | None = None) -> T:
        url = self.base_url + path
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if body is not None:
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(url, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                data = resp.read()
        except urllib.error.HTTPError as exc:
            raise _error_from(exc.code, exc.read()) from None
        except urllib.error.URLError as exc:
            raise GatewayUnreachable(self.base_url, str(exc.reason)) from None
        except (TimeoutError, ConnectionError) as exc:
            raise GatewayUnreachable(self.base_url, str(exc) or type(exc).__name__) from None
        try:
            return msgspec.json.decode(data, type=type_)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ClientError(0, f"unexpected answer from {url}: {exc}") from None


def _error_from(status: int, data: bytes) -> ClientError:
    """Decode the gateway's ``ErrorResponse``; anything else still becomes one clear line."""
    try:
        err = msgspec.json.decode(data, type=ErrorResponse)
        if status == 401:  # say how to fix it, not only what is wrong
            err.error += "; give --token, MOSAIC_TOKEN or MOSAIC_TOKEN_FILE"
        return ClientError(status, err.error, tuple(err.errors))
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass
    try:
        text = json.dumps(json.loads(data))[:200]
    except ValueError:
        text = data.decode(errors="replace").strip()[:200] or "no body"
    return ClientError(status, text)
