"""
MCP resources (SPEC §17): a computer's screen and files as things a client
reads by URI, besides the tools.

    trapsandbox://{traposId}/screen          text: the screen's lines
    trapsandbox://{traposId}/files/{+path}   a file: text when its bytes are
                                             UTF-8, else a base64 ``blob``

The traposId is percent-encoded in a URI (``trapsandbox://5%3Abase/screen``:
a bare ``:`` reads as a port to URI parsers, the MCP SDK's included); a bare
one, an id or a label are accepted as the tools' ``computer`` is
(``resolve``).  Who may read what is the tools' rule: the caller's computers
(its account's, the admin's every account's), an ask's token its own computer
only, and the computer itself refuses what its player did not allow
(``screen``, ``fs.read``).  ``resources/list`` lists the screens of the
computers that allowed ``screen``; files are read through the template.

A read that cannot be answered is a JSON-RPC error (resources have no
``isError`` result): "resource not found" for a URI that is not ours or a
computer that is not there (-32002 in the legacy revisions, -32602 in
2026-07-28, SEP-2164), -32003 for the computer's refusal or failure (not
allowed, no such file, no answer in time), each with the text a model acts
on (``text``) and the URI in ``data``.
"""

from __future__ import annotations

import base64
from typing import Any
from urllib.parse import quote, unquote

from twisted.internet.defer import TimeoutError

from trapsandbox import errors
from trapsandbox.computers import wire
from trapsandbox.computers.callers import Caller
from trapsandbox.computers.paths import canonical
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.errors import GatewayError
from trapsandbox.mcp.errors import INVALID_PARAMS, Invalid
from trapsandbox.mcp.resolve import computers, resolve
from trapsandbox.mcp.revision import LEGACY_REVISION, Revision
from trapsandbox.mcp.text import gateway_error_text

SCHEME = "trapsandbox://"
RESOURCE_NOT_FOUND = -32002
RESOURCE_REFUSED = -32003

TEMPLATES: list[dict[str, Any]] = [
    {
        "uriTemplate": SCHEME + "{traposId}/files/{+path}",
        "name": "file",
        "title": "A file on a computer",
        "description": (
            "A file on a ComputerCraft computer, by its traposId (percent-encoded: 7%3Abase "
            "for 7:base) and its path from / (e.g. trapsandbox://7%3Abase/files/startup.lua). "
            'Text when it is UTF-8, else base64. The player must have run "sandbox allow '
            'fs.read" on it.'
        ),
    }
]


def uri_of(trapos_id: str, what: str) -> str:
    """A resource's URI: the traposId percent-encoded, then ``what`` (``screen``, ``files/…``)."""
    return SCHEME + quote(trapos_id, safe="") + "/" + what


def not_found_code(revision: Revision) -> int:
    """MCP's "resource not found": -32002 until 2025-11-25, -32602 since (SEP-2164)."""
    return INVALID_PARAMS if revision.modern else RESOURCE_NOT_FOUND


def parse(uri: Any) -> tuple[str, str, str]:
    """A URI's computer (decoded), kind (``screen`` or ``files``) and path (``/…``)."""
    if type(uri) is not str:
        raise Invalid(INVALID_PARAMS, f"uri must be a {SCHEME} URI; resources/list shows them")
    if not uri.startswith(SCHEME):
        raise Invalid(
            INVALID_PARAMS,
            f"no resource {wire.cut(uri)}: uri must be a {SCHEME} URI; resources/list shows them",
            data={"uri": uri},
        )
    authority, _, rest = uri[len(SCHEME) :].partition("/")
    computer = unquote(authority)
    if rest == "screen" and computer:
        return computer, "screen", ""
    if rest.startswith("files/") and computer and len(rest) > len("files/"):
        # Canonical (``paths.canonical``): files/./notes.txt and files/notes.txt are one
        # resource, one subscription.
        try:
            path = canonical(unquote(rest[len("files/") :]), "/")
        except GatewayError as error:
            raise Invalid(INVALID_PARAMS, error.message, data={"uri": uri}) from None
        return computer, "files", path
    raise Invalid(
        INVALID_PARAMS,
        f'no resource "{wire.cut(uri)}": the URIs are {SCHEME}{{traposId}}/screen and '
        f"{SCHEME}{{traposId}}/files/{{path}}",
        data={"uri": uri},
    )


def locate(
    registry: Registry, uri: Any, caller: Caller, found: list, revision: Revision
) -> tuple[Any, str, str]:
    """
    ``(session, kind, path)`` of a resource URI among the caller's computers ``found``
    (``resolve.computers``): how a read and a subscription find what they mean; a computer
    the caller cannot see is the revision's "not found", with the ``uri`` in its data.
    """
    computer, kind, path = parse(uri)
    try:
        return resolve(registry, computer, caller.account, found), kind, path
    except GatewayError as error:
        raise Invalid(not_found_code(revision), error.message, data={"uri": uri}) from None


class Resources:
    """``resources/list`` and ``resources/read`` for one caller's computers."""

    def __init__(self, registry: Registry, sandbox: Sandbox) -> None:
        self._registry = registry
        self._sandbox = sandbox

    async def list(self, caller: Caller) -> dict[str, Any]:
        listed = []
        for session in await computers(self._registry, caller):
            if "screen" not in session.capabilities:
                continue
            listed.append(
                {
                    "uri": uri_of(session.trapos_id, "screen"),
                    "name": f"{session.trapos_id} screen",
                    "title": f"The screen of {session.trapos_id}",
                    "description": "What the computer's terminal shows now, line by line.",
                    "mimeType": "text/plain",
                }
            )
        return {"resources": listed}

    async def read(
        self,
        params: dict[str, Any],
        caller: Caller,
        revision: Revision = LEGACY_REVISION,
    ) -> dict[str, Any]:
        uri = params.get("uri")
        found = await computers(self._registry, caller)
        session, kind, path = locate(self._registry, uri, caller, found, revision)
        caller = caller.at(session.account_id, session.trapos_id)
        try:
            if kind == "screen":
                answer = await self._sandbox.screen(caller)
                lines = answer.get("lines") if isinstance(answer.get("lines"), list) else []
                text = "\n".join(str(line).rstrip() for line in lines)
                return {"contents": [{"uri": uri, "mimeType": "text/plain", "text": text}]}
            answer = await self._sandbox.read_file(caller, path)
        except GatewayError as error:
            if error.code == errors.NOT_CONNECTED:
                code = not_found_code(revision)
            else:
                code = RESOURCE_REFUSED
            raise Invalid(code, gateway_error_text(error, session), data={"uri": uri}) from None
        except TimeoutError:
            raise Invalid(
                RESOURCE_REFUSED, f"{session.trapos_id} did not answer in time", data={"uri": uri}
            ) from None
        content: bytes = answer["content"]
        try:
            return {"contents": [{"uri": uri, "mimeType": "text/plain", "text": content.decode()}]}
        except UnicodeDecodeError:
            blob = base64.b64encode(content).decode("ascii")
            return {
                "contents": [{"uri": uri, "mimeType": "application/octet-stream", "blob": blob}]
            }
