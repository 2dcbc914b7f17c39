"""
The one family of errors, imported by every layer (it imports nothing of ours):

- the codes every surface answers with (``error.code`` on the wire, SPEC §2, and the few of
  docs/protocol.md), and ``STATUS``: the HTTP status each is answered with;
- ``GatewayError``: a request that fails, whoever finds out why (the computer, the registry,
  a route reading a bad body: ``bad_request``), raised and caught as this one type;
- ``body``: the two shapes of a failure's JSON body, written in one place;
- ``ConfigError``: a setting with a bad value (``config``, the accounts file, the state
  directory, a ``--port``), turned into one line at start by ``tap``.
"""

from __future__ import annotations

from typing import Any

import attrs

UNAUTHORIZED = "unauthorized"
NOT_AUTHENTICATED = "not_authenticated"
UNKNOWN_TYPE = "unknown_type"
NOT_CONNECTED = "not_connected"
INTERNAL = "internal"
TIMEOUT = "timeout"
BAD_REQUEST = "bad_request"
TOO_LARGE = "too_large"
OVERLOADED = "overloaded"
FORBIDDEN = "forbidden"  # the computer's owner has not allowed that capability
CANCELLED = "cancelled"  # the requester gave up and said so
FS_ERROR = "fs_error"  # CraftOS refused a file operation; the message is its own
# A peripheral call or turtle action failed; the message is CraftOS's own.
PERIPHERAL_ERROR = "peripheral_error"
# The computer's player stopped the agent there (``sandbox stop``, or the stop side's redstone).
STOPPED = "stopped"
# One account already holds as many watches of that kind as it may (``limits``).
TOO_MANY_WATCHES = "too_many_watches"
OPENCODE_ERROR = "opencode_error"
# Cluster mode: the process holding the computer, or Redis, cannot be reached.
UNAVAILABLE = "unavailable"
# No such thing of this account's (a snapshot, a route, a file of the gateway's own).
NOT_FOUND = "not_found"
# The admin named a traposId that several accounts hold (SPEC §12).
AMBIGUOUS = "ambiguous"
TOO_MANY_REQUESTS = "too_many_requests"

# The HTTP status each code is answered with (500 for any other).
STATUS = {
    BAD_REQUEST: 400,
    UNAUTHORIZED: 401,
    FORBIDDEN: 403,
    NOT_CONNECTED: 404,
    NOT_FOUND: 404,
    AMBIGUOUS: 409,
    # The player stopped the agent on the computer: only they can resume it.
    STOPPED: 409,
    TOO_LARGE: 413,
    FS_ERROR: 422,
    PERIPHERAL_ERROR: 422,
    TOO_MANY_REQUESTS: 429,
    # One account already holds as many watches of that kind as it may.
    TOO_MANY_WATCHES: 429,
    # The computer runs a client that does not know the request (an older version).
    UNKNOWN_TYPE: 501,
    OVERLOADED: 503,
    UNAVAILABLE: 503,
    TIMEOUT: 504,
}


@attrs.frozen
class Error:
    """An error as the wire carries it: ``{code, message}``."""

    code: str
    message: str


class GatewayError(Exception):
    """
    A request failed; ``code`` says how (one of the codes above, or a computer's own),
    ``message`` why, for a person.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message

    @property
    def status(self) -> int:
        """The HTTP status to answer with: the code's own."""
        return STATUS.get(self.code, 500)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def to_wire(self) -> Error:
        return Error(self.code, self.message)


def bad_request(message: str) -> GatewayError:
    """The caller sent something wrong; ``message`` says what (a new one each time: a raised
    exception keeps the frames it went through)."""
    return GatewayError(BAD_REQUEST, message)


def body(code: str, message: str, sandbox: bool = False) -> dict[str, Any]:
    """
    A failure's JSON body, in SPEC's two shapes: ``{ok: false, error: {code, message}}`` on
    every route but the sandbox's, ``{ok: false, error: "<message>", code}`` on SPEC §9's.
    """
    if sandbox:
        return {"ok": False, "error": message, "code": code}
    return {"ok": False, "error": {"code": code, "message": message}}


class ConfigError(ValueError):
    """A setting has a bad value; the message names the setting."""
