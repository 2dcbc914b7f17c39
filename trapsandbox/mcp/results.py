"""
What a tool call ends as (SPEC §10): an MCP ``CallToolResult`` (the text a
model reads, the structured answer, ``isError``) and its outcome, a bounded
metrics label.  Every failure the model can correct, or that happened on the
computer's side, is a ``GatewayError`` (its code the outcome, its message what the
model reads): an ``isError`` result, not a JSON-RPC
error (the 2025-11-25 split, SEP-1303).
"""

from __future__ import annotations

from typing import Any

from trapsandbox import errors
from trapsandbox.errors import GatewayError

# Outcomes of a tool call besides ok and the computer's error codes (bounded labels).
AMBIGUOUS = errors.AMBIGUOUS
INVALID_ARGUMENTS = "invalid_arguments"
LUA_ERROR = "lua_error"
# Every outcome a call can have: a computer's error code is counted only if it is one of ours.
OUTCOMES = frozenset(
    {
        "ok",
        AMBIGUOUS,
        INVALID_ARGUMENTS,
        LUA_ERROR,
        errors.FORBIDDEN,
        errors.NOT_CONNECTED,
        errors.TIMEOUT,
        errors.FS_ERROR,
        errors.PERIPHERAL_ERROR,
        errors.STOPPED,
        errors.TOO_LARGE,
        errors.OVERLOADED,
        errors.BAD_REQUEST,
        errors.UNKNOWN_TYPE,
        errors.CANCELLED,
        errors.INTERNAL,
    }
)


def result(text: str, structured: dict[str, Any] | None, error: bool = False) -> dict[str, Any]:
    """A ``CallToolResult``: ``text`` for the model, ``structured`` for a program."""
    answer: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
    if structured is not None:
        answer["structuredContent"] = structured
    if error:
        answer["isError"] = True
    return answer


def failed(error: GatewayError) -> dict[str, Any]:
    """The ``isError`` result of ``error`` (its code is the call's outcome)."""
    return result(error.message, {"ok": False, "code": error.code}, error=True)
