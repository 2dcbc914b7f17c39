"""
Answers written onto a twisted.web request: the status, the JSON headers,
and the body bytes a route returns.  Two body shapes, as SPEC has them:
``{ok: false, error: {code, message}}`` for every route but the sandbox's
(``json_error``, ``write_answer`` for an ``operator.Answer``), and
``{ok: false, error: "<message>", code}`` for the §9 sandbox routes
(``sandbox_error``).
"""

from __future__ import annotations

from typing import Any

import orjson
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest

from trapsandbox import errors
from trapsandbox.errors import GatewayError
from trapsandbox.web.operator import Answer


def json_body(request: IRequest, body: Any, code: int = 200) -> bytes:
    request.setResponseCode(code)
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-store")
    return orjson.dumps(body)


def json_error(request: IRequest, code: int, error: str, message: str) -> bytes:
    return json_body(request, errors.body(error, message), code)


def write_answer(request: IRequest, answer: Answer) -> bytes:
    """An ``operator.Answer`` onto ``request``: its status and headers set, its body returned."""
    status, body, headers = answer.encoded()
    request.setResponseCode(status)
    for name, value in headers:
        request.setHeader(name, value)
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-store")
    return body


def sandbox_error(request: IRequest, status: int, code: str, message: str) -> bytes:
    """A failure of a §9 endpoint: ``{ok: false, error: "<message>", code}``."""
    return json_body(request, errors.body(code, message, sandbox=True), status)


def gateway_error(request: IRequest, error: GatewayError) -> bytes:
    """A §9 endpoint's ``error``, answered with its status."""
    return sandbox_error(request, error.status, error.code, error.message)


def sandbox_failed(failure: Failure, request: IRequest) -> bytes | Failure:
    """A §9 call's failure, answered; what is not a ``GatewayError`` is passed on."""
    if failure.check(GatewayError):
        return gateway_error(request, failure.value)
    return failure  # cancelled (the client went away), or a bug for internal_error


def _relayable(request: IRequest, body: dict[str, Any]) -> bytes:
    try:
        return json_body(request, body)
    except orjson.JSONEncodeError as error:
        # orjson reads deeper nesting (1024) than it writes (254).
        return sandbox_error(
            request, 502, errors.INTERNAL, f"the computer's answer cannot be relayed: {error}"
        )


def ok_body(payload: dict[str, Any], request: IRequest) -> bytes:
    """A §9 call's answer, as ``{ok: true, ...}``."""
    return _relayable(request, {"ok": True, **payload})


def plain_body(payload: dict[str, Any], request: IRequest) -> bytes:
    """A §9 call's answer as the computer gave it (``eval``'s has its own ``ok``)."""
    return _relayable(request, payload)
