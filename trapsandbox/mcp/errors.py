"""
The JSON-RPC errors of ``/mcp`` (SPEC §10, §17): the codes, and ``Invalid``,
the one exception a method or the envelope raises to answer with an error.
The transport (``jsonrpc``) writes it, with the request's id whenever the id
could be read.
"""

from __future__ import annotations

from typing import Any

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603


class Invalid(Exception):
    """A JSON-RPC error for one message: code, message, HTTP status, and ``data``."""

    def __init__(self, code: int, message: str, status: int = 200, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.data = data
