"""
The checks of a tool's arguments (SPEC §10): a value a tool cannot use is a
``GatewayError`` ``invalid_arguments`` whose text says what to send instead, so
the model can correct itself.  (The JSON Schemas in ``schemas`` say the same
to a client beforehand; a model does not always follow them.)
"""

from __future__ import annotations

import math
from typing import Any

from trapsandbox import errors, limits
from trapsandbox.computers import wire
from trapsandbox.errors import GatewayError
from trapsandbox.mcp.results import INVALID_ARGUMENTS


def string(arguments: dict[str, Any], name: str, empty: bool = False) -> str:
    value = arguments.get(name)
    if type(value) is not str or (not empty and not value):
        raise GatewayError(INVALID_ARGUMENTS, f"{name} is required: a non-empty string")
    return value


def strings(arguments: dict[str, Any], name: str) -> list[str]:
    try:
        value = arguments.get(name)
        return [] if value is None else wire.string_list(value)
    except TypeError:
        raise GatewayError(INVALID_ARGUMENTS, f"{name} must be a list of strings") from None


def values(arguments: dict[str, Any], name: str) -> list[Any]:
    """An optional list of any JSON values: the arguments of a peripheral call."""
    value = arguments.get(name)
    if value is None:
        return []
    if type(value) is not list:
        raise GatewayError(INVALID_ARGUMENTS, f"{name} must be a list (JSON values, in order)")
    return value


def run_seconds(arguments: dict[str, Any], most: float = limits.MCP_MAX_RUN_SECONDS) -> float:
    """``timeoutSeconds``, kept within ``most`` (more with progress, SPEC §17)."""
    value = arguments.get("timeoutSeconds")
    if value is None:
        return limits.DEFAULT_RUN_TIMEOUT_MS / 1000
    if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
        raise GatewayError(INVALID_ARGUMENTS, "timeoutSeconds must be a number of seconds above 0")
    # A longer run would outlive the call: run it as long as a call may take.
    return min(float(value), most)


def file_content(arguments: dict[str, Any]) -> bytes:
    """``content`` as the file's bytes (UTF-8), within what one call may write."""
    data = string(arguments, "content", empty=True).encode("utf-8", "surrogatepass")
    if len(data) > limits.MAX_FILE_BYTES:
        raise GatewayError(
            errors.TOO_LARGE,
            f"content is {len(data)} bytes; at most {limits.MAX_FILE_BYTES} can be written "
            "in one call (and the disk holds about 1 MB)",
        )
    return data


def input_events(arguments: dict[str, Any]) -> list[dict[str, Any]]:
    """
    ``send_input``'s ``text``, ``keys`` and ``terminate`` as ``input`` events, in
    that order: each character of the text a ``char`` (a line break the
    ``enter`` key; a run of more than ``PASTE_AFTER`` characters one ``paste``),
    each key name a ``key``, then ``terminate``.  The computer checks the key names.
    """
    text = arguments.get("text")
    if text is not None and type(text) is not str:
        raise GatewayError(INVALID_ARGUMENTS, "text must be a string")
    keys = strings(arguments, "keys")
    terminate = arguments.get("terminate", False)
    if type(terminate) is not bool:
        raise GatewayError(INVALID_ARGUMENTS, "terminate must be true or false")
    events: list[dict[str, Any]] = []
    for n, line in enumerate((text or "").split("\n")):
        if n:
            events.append({"key": "enter"})
        if len(line) > PASTE_AFTER:
            events.append({"paste": line})
        else:
            events.extend({"char": char} for char in line)
    events.extend({"key": key} for key in keys)
    if terminate:
        events.append({"terminate": True})
    if not events:
        raise GatewayError(
            INVALID_ARGUMENTS, "give text, keys or terminate: there is nothing to send"
        )
    if len(events) > limits.MAX_INPUT_EVENTS:
        raise GatewayError(
            INVALID_ARGUMENTS,
            f"that is {len(events)} input events; at most {limits.MAX_INPUT_EVENTS} in one call "
            "(fewer keys or line breaks, or several calls)",
        )
    return events


# Characters typed one by one; a longer line is sent as one paste.
PASTE_AFTER = 64
