"""
Which MCP revision a request speaks, and the envelope that revision puts
around every answer (SPEC §17): one endpoint serves both eras, chosen per
request as the 2026-07-28 versioning page says.

    legacy   2025-03-26, 2025-06-18, 2025-11-25: ``initialize`` once, then
             requests carrying the ``MCP-Protocol-Version`` header (or none,
             for 2025-03-26).  Answered exactly as before this module
             existed: opencode 1.18.33 sees no difference.
    modern   2026-07-28, stateless: no handshake and no session; each request
             carries ``_meta`` with ``io.modelcontextprotocol/protocolVersion``
             and ``clientCapabilities``, and the headers ``MCP-Protocol-Version``,
             ``Mcp-Method`` and (tools/call, prompts/get, resources/read)
             ``Mcp-Name`` that must match the body.  A request needs no earlier
             one, so any process of a cluster can answer it.

A request is modern when its ``MCP-Protocol-Version`` header names a modern
revision or its ``_meta`` declares a version at all; otherwise it is legacy.
A modern request that cannot be served is refused here, before any method
runs, with HTTP 400 and the revision's error: -32602 (``_meta`` incomplete),
-32020 (a header missing or not matching the body), -32022 (a version we do
not speak, with ``data: {supported, requested}``).  A method a modern
request may not call (the removed ``initialize``, ``ping``,
``logging/setLevel``, ``resources/subscribe``, ... or one that never existed)
is HTTP 404 with -32601 (``status``).

Every modern result gets ``resultType: "complete"`` and the server's
identity in ``_meta``; the cacheable ones (lists, reads, discovery) get
``ttlMs`` and ``cacheScope`` (``decorate``).  Legacy results are left as
they are.  What the methods mean is the endpoint's; this module is only the
envelope.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import attrs
from twisted.web.iweb import IRequest

from trapsandbox import __version__
from trapsandbox.computers.wire import cut
from trapsandbox.mcp.errors import INVALID_PARAMS, METHOD_NOT_FOUND, Invalid
from trapsandbox.mcp.logs import LEVELS
from trapsandbox.mcp.schemas import TOOLS
from trapsandbox.mcp.text import INSTRUCTIONS

MODERN = ("2026-07-28",)
# Newest last: what ``initialize`` answers a client asking for another.
LEGACY = ("2025-03-26", "2025-06-18", "2025-11-25")
LATEST_LEGACY = LEGACY[-1]
# Newest first, as ``server/discover`` lists them.
SUPPORTED = MODERN + tuple(reversed(LEGACY))

HEADER_MISMATCH = -32020
MISSING_REQUIRED_CLIENT_CAPABILITY = -32021
UNSUPPORTED_PROTOCOL_VERSION = -32022

PROTOCOL_VERSION = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
LOG_LEVEL = "io.modelcontextprotocol/logLevel"
SERVER_INFO = "io.modelcontextprotocol/serverInfo"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"

SERVER = {"name": "trapsandbox", "title": "trapsandbox", "version": __version__}
CAPABILITIES: dict[str, Any] = {
    "tools": {},
    "resources": {"subscribe": True},
    "prompts": {},
    "completions": {},
    "logging": {},
}

# Methods each era may call (anything else is -32601).
LEGACY_METHODS = frozenset(
    {
        "initialize",
        "ping",
        "logging/setLevel",
        "tools/list",
        "tools/call",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "resources/subscribe",
        "resources/unsubscribe",
        "prompts/list",
        "prompts/get",
        "completion/complete",
    }
)
MODERN_METHODS = frozenset(
    {
        "server/discover",
        "tools/list",
        "tools/call",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "prompts/list",
        "prompts/get",
        "completion/complete",
        "subscriptions/listen",
    }
)

# Caching hints (SEP-2549), in milliseconds.  The tools, prompts and template
# never change while a gateway runs; which computers are connected (the
# resources) and what they show (a read) change any moment.  Private: an
# account sees only its own computers, so no shared cache may keep an answer.
_STATIC_TTL_MS = 60 * 60 * 1000
TTL_MS = {
    "server/discover": _STATIC_TTL_MS,
    "tools/list": _STATIC_TTL_MS,
    "prompts/list": _STATIC_TTL_MS,
    "resources/templates/list": _STATIC_TTL_MS,
    "resources/list": 0,
    "resources/read": 0,
}

TOOL_SCHEMAS = {tool["name"]: tool["inputSchema"] for tool in TOOLS}

# Where ``Mcp-Name`` comes from, by method.
_NAMED = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}


@attrs.frozen
class Revision:
    """The revision one request speaks, and what it said about itself in ``_meta``."""

    version: str
    modern: bool
    client_capabilities: dict[str, Any] = attrs.field(factory=dict)
    # Modern: the request's own log level (None: it wants no notifications/message).
    log_level: str | None = None

    def status(self, code: int) -> int:
        """The HTTP status of an error answer with ``code`` (modern: -32601 is a 404)."""
        return 404 if self.modern and code == METHOD_NOT_FOUND else 200

    def allows(self, method: str) -> bool:
        return method in (MODERN_METHODS if self.modern else LEGACY_METHODS)


LEGACY_REVISION = Revision(LEGACY[0], modern=False)


def choose(request: IRequest, method: str, params: dict[str, Any]) -> Revision | None:
    """
    The revision of a request for ``method`` with ``params``, or an
    ``Invalid`` (HTTP 400) for a modern request that cannot be served; None
    for a legacy request whose ``MCP-Protocol-Version`` we do not speak (the
    transport refuses it as it always has).
    """
    raw = request.getHeader(b"mcp-protocol-version")
    header = None if raw is None else raw.decode("latin-1").strip()
    meta = params.get("_meta")
    declared = meta.get(PROTOCOL_VERSION) if type(meta) is dict else None
    if header not in MODERN and declared is None:
        if header is None or header in LEGACY or method == "initialize":
            return Revision(header or LEGACY[0], modern=False)
        return None
    return _modern(request, method, params, header, meta)


def _modern(
    request: IRequest, method: str, params: dict[str, Any], header: str | None, meta: Any
) -> Revision:
    def refuse(code: int, message: str, data: Any = None) -> Invalid:
        return Invalid(code, message, 400, data)

    if type(meta) is not dict:
        raise refuse(
            INVALID_PARAMS,
            f"a {MODERN[0]} request carries params._meta with {PROTOCOL_VERSION} and "
            f"{CLIENT_CAPABILITIES}",
        )
    declared = meta.get(PROTOCOL_VERSION)
    if type(declared) is not str:
        raise refuse(INVALID_PARAMS, f"_meta needs {PROTOCOL_VERSION}, a string")
    capabilities = meta.get(CLIENT_CAPABILITIES)
    if type(capabilities) is not dict:
        raise refuse(INVALID_PARAMS, f"_meta needs {CLIENT_CAPABILITIES}, an object")
    if header is None:
        raise refuse(HEADER_MISMATCH, "the MCP-Protocol-Version header is missing")
    if header != declared:
        raise refuse(
            HEADER_MISMATCH,
            f"the MCP-Protocol-Version header ({cut(header)}) does not match "
            f"_meta's {PROTOCOL_VERSION} ({cut(declared)})",
        )
    if declared not in MODERN:
        raise refuse(
            UNSUPPORTED_PROTOCOL_VERSION,
            f"unsupported protocol version {cut(declared)}; this server speaks "
            + ", ".join(SUPPORTED),
            {"supported": list(SUPPORTED), "requested": declared},
        )
    _check_header(request, b"mcp-method", "Mcp-Method", method)
    if method in _NAMED:
        named = params.get(_NAMED[method])
        if type(named) is str:
            _check_header(request, b"mcp-name", "Mcp-Name", named)
    if method == "tools/call":
        _check_params(request, params)
    level = meta.get(LOG_LEVEL)
    if level is not None and level not in LEVELS:
        raise refuse(INVALID_PARAMS, f"{LOG_LEVEL} must be one of " + ", ".join(LEVELS))
    return Revision(declared, True, capabilities, level)


def _check_params(request: IRequest, params: dict[str, Any]) -> None:
    """
    The ``Mcp-Param-*`` headers of a ``tools/call``: each argument whose schema
    says ``x-mcp-header`` and that the call gives (a string, integer or
    boolean) must come as its header too, with the same value (SEP-2243).
    """
    arguments = params.get("arguments")
    if type(arguments) is not dict:
        return
    schema = TOOL_SCHEMAS.get(params.get("name"))
    properties = schema.get("properties", {}) if schema else {}
    for name, property in properties.items():
        header = property.get("x-mcp-header")
        value = arguments.get(name)
        if header is None or value is None:
            continue
        if type(value) is bool:
            shown = "true" if value else "false"
        elif type(value) in (str, int):
            shown = str(value)
        else:
            continue  # the tool itself refuses a value of the wrong type
        _check_header(
            request, b"mcp-param-" + header.lower().encode(), f"Mcp-Param-{header}", shown
        )


def _check_header(request: IRequest, name: bytes, shown: str, body_value: str) -> None:
    """
    ``name`` must be present once and, once decoded, equal to what the body says: a
    second one is refused, as a balancer routing by the first and the gateway checking
    the last would not agree on the computer.
    """
    every = request.requestHeaders.getRawHeaders(name) or []
    if not every:
        raise Invalid(HEADER_MISMATCH, f"the {shown} header is missing", 400)
    if len(every) > 1:
        raise Invalid(HEADER_MISMATCH, f"the {shown} header is given {len(every)} times", 400)
    [raw] = every
    # RFC 9110: the whitespace around a field value is not part of it.
    value = _decoded(raw.strip(b" \t"))
    if value is None:
        raise Invalid(HEADER_MISMATCH, f"the {shown} header is not a valid value", 400)
    if value != body_value:
        raise Invalid(
            HEADER_MISMATCH,
            f"the {shown} header ({cut(value or '?')}) does not match the body ({cut(body_value)})",
            400,
        )


def _decoded(raw: bytes) -> str | None:
    """A header value, its ``=?base64?…?=`` form decoded (None: not a valid value)."""
    if any(byte < 0x20 or byte > 0x7E for byte in raw.replace(b"\t", b" ")):
        return None
    if raw.startswith(b"=?base64?") and raw.endswith(b"?=") and len(raw) >= 11:
        payload = raw[9:-2]
        try:
            decoded = base64.b64decode(payload, validate=True)
        except binascii.Error:
            return None
        if base64.b64encode(decoded) != payload:
            return None  # not the one canonical form (stray bits, missing padding)
        try:
            return decoded.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return raw.decode("ascii")


def decorate(revision: Revision, method: str, result: dict[str, Any]) -> dict[str, Any]:
    """A method's result as ``revision`` sends it (legacy: as it is)."""
    if not revision.modern:
        return result
    meta = dict(result.get("_meta") or {})
    meta[SERVER_INFO] = SERVER
    decorated = {**result, "resultType": "complete", "_meta": meta}
    ttl = TTL_MS.get(method)
    if ttl is not None:
        decorated["ttlMs"] = ttl
        decorated["cacheScope"] = "private"
    return decorated


def discover() -> dict[str, Any]:
    """``server/discover``: the versions, capabilities and identity (SEP-2575)."""
    return {
        "supportedVersions": list(SUPPORTED),
        "capabilities": CAPABILITIES,
        "instructions": INSTRUCTIONS,
    }


def initialize(params: dict[str, Any]) -> dict[str, Any]:
    """``initialize`` (legacy): the client's version when we speak it, else our newest."""
    asked = params.get("protocolVersion")
    if type(asked) is not str:
        raise Invalid(INVALID_PARAMS, "initialize needs protocolVersion, a string")
    return {
        "protocolVersion": asked if asked in LEGACY else LATEST_LEGACY,
        "capabilities": CAPABILITIES,
        "serverInfo": SERVER,
        "instructions": INSTRUCTIONS,
    }
