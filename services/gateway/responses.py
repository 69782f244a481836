"""The admin routes' JSON answers, one way for all of them (cordons, tenants, services): a
body encoded once with msgspec, an error as ``{"error": ..., "errors": [{field, reason}]}``
(each refusal names its field), and the gateway behind a request."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web

from proto.validation import FieldError

if TYPE_CHECKING:
    from services.gateway.service import Gateway

_encoder = msgspec.json.Encoder()


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=_encoder.encode(obj), status=status, content_type="application/json")


def error_response(status: int, message: str, errors: Sequence[FieldError] = ()) -> web.Response:
    return json_response({"error": message, "errors": tuple(errors)}, status)


def gateway_of(request: web.Request) -> Gateway:
    from services.gateway.api import GATEWAY_KEY

    return request.app[GATEWAY_KEY]
