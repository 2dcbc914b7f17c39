"""
``completion/complete`` (SPEC §17): what an argument can be, as the client's
user types it.

    ref/resource trapsandbox://{traposId}/files/{+path}
        traposId   the computers this caller sees (its account's; an ask's
                   token, its own computer), by traposId
        path       the entries of the folder typed so far, on the computer
                   ``context.arguments.traposId`` names, when its player
                   allowed ``fs.read`` (folders end with ``/``)
    ref/prompt (``prompts``)
        computer   as traposId above (a label or id typed matches too)
        program    as path above, on the prompt's ``computer``

Anything else completes to nothing.  Nothing is ever offered from a computer
the caller cannot see: the names come from ``resolve.computers`` and a folder
is listed only on a computer ``resolve`` finds among them, as the tools do;
a computer that is not there, or a folder it refuses, completes to nothing
rather than to an error, so a completion tells no more than ``list_computers``.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import TimeoutError

from trapsandbox.computers.callers import Caller
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.errors import GatewayError
from trapsandbox.mcp.errors import INVALID_PARAMS, Invalid
from trapsandbox.mcp.prompts import PROMPT_NAMES
from trapsandbox.mcp.resolve import computers, resolve, split
from trapsandbox.mcp.resources import TEMPLATES

# MCP's bound on the values of one answer.
MAX_VALUES = 100
_TEMPLATE = TEMPLATES[0]["uriTemplate"]


class Completions:
    """``completion/complete`` for one caller's computers."""

    def __init__(self, registry: Registry, sandbox: Sandbox) -> None:
        self._registry = registry
        self._sandbox = sandbox

    async def complete(self, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
        ref = params.get("ref")
        argument = params.get("argument")
        if type(ref) is not dict or type(argument) is not dict:
            raise Invalid(INVALID_PARAMS, "completion/complete needs ref and argument, objects")
        name = argument.get("name")
        value = argument.get("value", "")
        if type(name) is not str or type(value) is not str:
            raise Invalid(INVALID_PARAMS, "argument needs name and value, strings")
        context = params.get("context")
        given = context.get("arguments") if type(context) is dict else None
        given = given if type(given) is dict else {}
        kind = ref.get("type")
        if kind == "ref/resource":
            if ref.get("uri") != _TEMPLATE:
                raise Invalid(INVALID_PARAMS, f"the only resource template is {_TEMPLATE}")
            # (the template's computer argument, and its path)
            arguments = ("traposId", "path")
        elif kind == "ref/prompt":
            if ref.get("name") not in PROMPT_NAMES:
                raise Invalid(
                    INVALID_PARAMS, f"no prompt; the prompts are {', '.join(sorted(PROMPT_NAMES))}"
                )
            arguments = ("computer", "program")
        else:
            raise Invalid(INVALID_PARAMS, 'ref.type must be "ref/resource" or "ref/prompt"')
        computer, path = arguments
        if name == computer:
            values = await self._computers(value, caller)
        elif name == path:
            values = await self._entries(given.get(computer), value, caller)
        else:
            values = []
        return {
            "completion": {
                "values": values[:MAX_VALUES],
                "total": len(values),
                "hasMore": len(values) > MAX_VALUES,
            }
        }

    async def _computers(self, typed: str, caller: Caller) -> list[str]:
        """The traposIds of the caller's computers whose traposId, id or label starts so."""
        found = []
        for session in await computers(self._registry, caller):
            number, label = split(session.trapos_id)
            if any(part.startswith(typed) for part in (session.trapos_id, number, label)):
                found.append(session.trapos_id)
        return sorted(set(found))

    async def _entries(self, computer: Any, typed: str, caller: Caller) -> list[str]:
        """The entries of the folder ``typed`` is in, on ``computer``, that start as it does."""
        if type(computer) is not str or not computer:
            return []
        try:
            found = await computers(self._registry, caller)
            session = resolve(self._registry, computer, caller.account, found)
        except GatewayError:
            return []
        folder, _, start = typed.rpartition("/")
        try:
            answer = await self._sandbox.list_files(
                caller.at(session.account_id, session.trapos_id), "/" + folder.lstrip("/")
            )
        except (GatewayError, TimeoutError):
            return []
        entries = answer.get("entries") if isinstance(answer.get("entries"), list) else []
        lead = folder + "/" if folder or typed.startswith("/") else ""
        values = []
        for entry in entries:
            entry_name = entry.get("name") if isinstance(entry, dict) else None
            if isinstance(entry_name, str) and entry_name.startswith(start):
                slash = "/" if entry.get("type") == "dir" else ""
                values.append(lead + entry_name + slash)
        return sorted(values)
