"""
What an operator's request may hold: the one validator of request bodies
and their fields, and the one error for a request the caller got wrong.

``bad_request`` is that error, on every operator surface (``POST
/computers/{id}/requests``, the §9 sandbox routes, the ``/operator``
socket's messages): it carries the HTTP status and the error code its
answer has, and its message says what was wrong.  Each surface writes it in
its own body shape (``operator.rejected`` for the ``{ok, error: {code,
message}}`` answers, ``answers.sandbox_error`` for §9's), so the status and
the code are decided here, once.

The field checks take the decoded JSON object and a field's name, return
the field's value (or the default for an absent optional field), and raise
``bad_request`` naming the field and what it must be.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from typing import Any

import orjson
from twisted.web.iweb import IRequest

from trapsandbox import errors
from trapsandbox.computers import wire
from trapsandbox.errors import GatewayError
from trapsandbox.limits import MAX_BODY_BYTES


def too_large() -> GatewayError:
    # A new one each time: a raised exception keeps the frames it went through.
    return GatewayError(errors.TOO_LARGE, f"the body is over {MAX_BODY_BYTES} bytes")


def read_body(request: IRequest) -> bytes:
    """
    A twisted.web request's body, of which the request keeps no copy;
    ``too_large`` past ``MAX_BODY_BYTES`` (``site.GatewaySite`` drops a body
    that is over, and flags it ``over_limit``).
    """
    body = request.content.read(MAX_BODY_BYTES + 1)
    if getattr(request.content, "over_limit", False) or len(body) > MAX_BODY_BYTES:
        raise too_large()
    # The request object lives until the computer answers: keep no copy of
    # a body that may be megabytes.
    request.content.close()
    request.content = io.BytesIO()
    return body


def json_object(body: bytes, shape: str, what: str = "the body") -> dict[str, Any]:
    """
    The JSON object ``body`` holds; else ``bad_request`` naming ``shape`` (its
    fields) and calling it ``what``.
    """
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise errors.bad_request(f"{what} is not JSON: {error}") from None
    if type(obj) is not dict:
        raise errors.bad_request(f"{what} must be a JSON object: {shape}")
    return obj


def string(obj: dict[str, Any], name: str, required: bool = True) -> str | None:
    """A non-empty string; an optional one may be absent (None)."""
    value = obj.get(name)
    if value is None and not required:
        return None
    if type(value) is not str or (required and not value):
        raise errors.bad_request(f"{name} must be a non-empty string")
    return value


def short_string(obj: dict[str, Any], name: str, most: int) -> str:
    """A string of 1 to ``most`` characters (a request's type, a traposId)."""
    value = obj.get(name)
    if type(value) is not str or not 0 < len(value) <= most:
        raise errors.bad_request(f"{name} must be a string of 1 to {most} characters")
    return value


def number(
    obj: dict[str, Any], name: str, high: float, integer: bool = False, unit: str | None = None
) -> Any:
    """An optional positive number of at most ``high`` (None if absent), of ``unit`` if said."""
    value = obj.get(name)
    if value is None:
        return None
    kinds = (int,) if integer else (int, float)
    # (type(), not isinstance: True is an int in Python, and not a number here.)
    if type(value) not in kinds or not math.isfinite(value) or not 0 < value <= high:
        kind = "whole number" if integer else "number"
        if unit is not None:
            raise errors.bad_request(f"{name} must be a {kind} of {unit}, 1 to {high}")
        raise errors.bad_request(f"{name} must be a {kind} from 1 to {high}")
    return value


def offset(obj: dict[str, Any], name: str) -> int:
    """A whole number of bytes, 0 or more; 0 if absent."""
    value = obj.get(name, 0)
    if type(value) is not int or value < 0:
        raise errors.bad_request(f"{name} must be a whole number of bytes, 0 or more")
    return value


def strings(obj: dict[str, Any], name: str) -> list[str]:
    """An optional list of strings ([] if absent)."""
    try:
        value = obj.get(name)
        return [] if value is None else wire.string_list(value)
    except TypeError:
        raise errors.bad_request(f"{name} must be a list of strings") from None


def values(obj: dict[str, Any], name: str) -> list[Any]:
    """An optional list of any JSON values ([] if absent): a Lua call's arguments."""
    value = obj.get(name)
    if value is None:
        return []
    if type(value) is not list:
        raise errors.bad_request(f"{name} must be a list")
    return value


def query_names(request: IRequest, name: bytes) -> list[str]:
    """An optional comma-separated list of names in the query string (``?events=a,b``)."""
    found: list[str] = []
    for value in request.args.get(name, []):
        found.extend(part for part in value.decode("utf-8", "replace").split(",") if part)
    return found


def query_number(request: IRequest, name: bytes, low: int, high: int) -> int | None:
    """An optional whole number from ``low`` to ``high`` in the query string."""
    values = request.args.get(name)
    if not values:
        return None
    try:
        value = int(values[0])
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise errors.bad_request(f"{name.decode()} must be a whole number from {low} to {high}")
    return value


def objects(obj: dict[str, Any], name: str, most: int) -> list[dict[str, Any]]:
    """A list of at most ``most`` JSON objects (what each holds is the computer's to check)."""
    value = obj.get(name)
    if type(value) is not list or not all(type(item) is dict for item in value):
        raise errors.bad_request(f"{name} must be a list of objects")
    if len(value) > most:
        raise errors.bad_request(f"{len(value)} {name}, at most {most} in one request")
    return value


def optional_object(obj: dict[str, Any], name: str) -> dict[str, Any]:
    """An optional JSON object ({} if absent)."""
    value = obj.get(name)
    if value is None:
        return {}
    if type(value) is not dict:
        raise errors.bad_request(f"{name} must be a JSON object")
    return value


def base64_encoding(obj: dict[str, Any]) -> None:
    """File content travels as base64: ``encoding``, if given, must say so."""
    if obj.get("encoding", "base64") != "base64":
        raise errors.bad_request('encoding must be "base64"')


def base64_bytes(obj: dict[str, Any], name: str) -> bytes:
    """The bytes a base64 string field holds."""
    value = obj.get(name)
    try:
        if type(value) is not str:
            raise ValueError
        return base64.b64decode(value, validate=True)
    except (ValueError, binascii.Error):
        raise errors.bad_request(f"{name} must be the file's bytes in base64") from None
