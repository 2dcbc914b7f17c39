"""
MCP on the gateway (SPEC §10): opencode's agent, or any MCP client, drives
the connected computers as tools.

A small JSON-RPC 2.0 handler over MCP's Streamable HTTP transport, in the
gateway's own process and reactor (the ``mcp`` SDK's server would bring a
second HTTP stack beside twisted.web).  ``GatewayApp`` routes ``/mcp`` here
behind the operator rules of §4.

    POST /mcp  one JSON-RPC message
        a request        -> 200 application/json: its response (result or error)
        a notification   -> 202, no body (opencode sends notifications/cancelled
                            after every call: accepted quietly)
        a response       -> 202, no body (this server sends no requests)
        not JSON         -> 400 {jsonrpc, id: null, error: -32700}
        a batch (array)  -> 400 -32600: batching was removed from MCP in
                            2025-06-18, and no client we serve sends one
        not a message    -> 400 -32600 (not an object, bad jsonrpc/id/method)
        too large        -> 413 -32600
        an unsupported MCP-Protocol-Version header -> 400 -32600
        (a browser's request, a stranger's, or not application/json: refused
        before it gets here, by the operator rules of ``OperatorRequests.admit``)
    GET /mcp and the rest -> 405, Allow: POST (no server-to-client stream)

Methods: ``initialize`` (the client's protocol version when we speak it, else
our newest), ``ping``, ``tools/list``, ``tools/call``; anything else is
-32601.  No session state is kept and no ``Mcp-Session-Id`` issued.

``tools/call`` errors follow the 2025-11-25 split (SEP-1303): an unknown tool
or params that are not ``{name, arguments?}`` are -32602; arguments a tool
cannot use, and every failure on the computer's side (forbidden, not
connected, timeout, fs_error, an ambiguous ``computer``), are tool results
with ``isError: true`` whose text tells the model what to do, so it can
correct itself.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable, Coroutine
from typing import Any

import attrs
import orjson
from twisted.internet.defer import CancelledError, Deferred, TimeoutError
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest

from trapsandbox import __version__, limits
from trapsandbox.computers import wire
from trapsandbox.computers.registry import Registry, Session
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.computers.wire import GatewayError
from trapsandbox.limits import LOCAL_ACCOUNT
from trapsandbox.ops.metrics import Metrics

log = Logger()

# Newest last: what ``initialize`` answers a client asking for another.
PROTOCOL_VERSIONS = ("2025-03-26", "2025-06-18", "2025-11-25")
LATEST = PROTOCOL_VERSIONS[-1]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

# Outcomes of a tool call besides ok and the computer's error codes (bounded labels).
AMBIGUOUS = "ambiguous"
INVALID_ARGUMENTS = "invalid_arguments"
LUA_ERROR = "lua_error"
# Every outcome a call can have: a computer's error code is counted only if it is one of ours.
OUTCOMES = frozenset(
    {
        "ok",
        AMBIGUOUS,
        INVALID_ARGUMENTS,
        LUA_ERROR,
        wire.FORBIDDEN,
        wire.NOT_CONNECTED,
        wire.TIMEOUT,
        wire.FS_ERROR,
        wire.TOO_LARGE,
        wire.OVERLOADED,
        wire.BAD_REQUEST,
        wire.UNKNOWN_TYPE,
        wire.CANCELLED,
        wire.INTERNAL,
    }
)

_MAX_INT_ID = 2**63

_COMPUTER = {
    "type": "string",
    "description": (
        'Which computer: its traposId ("7:base"), its bare computer id ("7") or its label '
        '("base") when that is unique among the connected computers. Omit it when exactly '
        "one computer is connected. list_computers shows them."
    ),
}
_PATH_HELP = (
    "A CraftOS path, absolute from / (e.g. /startup.lua, /data/notes.txt); /rom is the "
    "read-only system folder; the computer's disk holds about 1 MB in all."
)


def _allow(capability: str) -> str:
    return (
        f'The player must have allowed it on that computer with "sandbox allow {capability}" '
        "(otherwise the call fails and says so)."
    )


def _schema(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"computer": _COMPUTER, **properties},
        "additionalProperties": False,
    }
    if required:
        schema["required"] = list(required)
    return schema


_TIMEOUT = {
    "type": "number",
    "exclusiveMinimum": 0,
    "maximum": limits.MCP_MAX_RUN_SECONDS,
    "description": (
        f"Seconds before the run is stopped (default {limits.DEFAULT_RUN_TIMEOUT_MS // 1000}, "
        f"at most {limits.MCP_MAX_RUN_SECONDS:g}); you then get its output so far."
    ),
}
_PATH = {"type": "string", "minLength": 1, "description": _PATH_HELP}

TOOLS: list[dict[str, Any]] = [
    {
        "name": "list_computers",
        "title": "List the connected computers",
        "description": (
            "List the ComputerCraft computers connected to this gateway: each one's traposId "
            "(id:label), id, label and the capabilities its player allowed (exec, eval, "
            "fs.read, fs.write, screen). Call it first to learn what the computer argument "
            "of the other tools can be."
        ),
        "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False},
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "run_command",
        "title": "Run a program on a computer",
        "description": (
            "Run a CraftOS program on a computer as its shell would (e.g. command "
            '"ls" with args ["/"], or "/programs/mine.lua"), and get its output and exit '
            "code (0: it finished without error; 1: it failed or was not found). The "
            "program gets no keyboard input: one that waits for a key times out. " + _allow("exec")
        ),
        "inputSchema": _schema(
            {
                "command": {
                    "type": "string",
                    "minLength": 1,
                    "description": "The program: a name on the shell path or a CraftOS path.",
                },
                "args": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Its arguments, one string each.",
                },
                "timeoutSeconds": _TIMEOUT,
            },
            ("command",),
        ),
    },
    {
        "name": "run_lua",
        "title": "Run Lua code on a computer",
        "description": (
            'Run a chunk of Lua on a computer (e.g. "return 6*7" or statements using '
            "turtle, redstone, peripheral, fs, os) with the computer's globals, and get its "
            "return values (each rendered with textutils.serialize), what it printed, or its "
            "compile or runtime error. " + _allow("eval")
        ),
        "inputSchema": _schema(
            {
                "code": {"type": "string", "minLength": 1, "description": "The Lua chunk."},
                "timeoutSeconds": _TIMEOUT,
            },
            ("code",),
        ),
    },
    {
        "name": "list_files",
        "title": "List a folder on a computer",
        "description": (
            "List the files and folders in a folder of a computer, with their sizes and "
            "whether they are read-only. " + _PATH_HELP + " " + _allow("fs.read")
        ),
        "inputSchema": _schema({"path": _PATH}, ("path",)),
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "read_file",
        "title": "Read a file on a computer",
        "description": (
            "Read a file of a computer (up to 1 MiB). The text is the file's bytes as UTF-8 "
            "when they are valid UTF-8, otherwise base64, and the result says which. "
            + _PATH_HELP
            + " "
            + _allow("fs.read")
        ),
        "inputSchema": _schema({"path": _PATH}, ("path",)),
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "write_file",
        "title": "Write a file on a computer",
        "description": (
            "Create or replace a file of a computer with the given text (written as UTF-8; "
            "missing folders are created; the file is replaced whole or not at all; up to "
            "1 MiB). " + _PATH_HELP + " " + _allow("fs.write")
        ),
        "inputSchema": _schema(
            {
                "path": _PATH,
                "content": {"type": "string", "description": "The file's whole new text."},
            },
            ("path", "content"),
        ),
    },
    {
        "name": "delete_file",
        "title": "Delete a file on a computer",
        "description": "Delete a file or folder of a computer. "
        + _PATH_HELP
        + " "
        + _allow("fs.write"),
        "inputSchema": _schema({"path": _PATH}, ("path",)),
        "annotations": {"destructiveHint": True},
    },
    {
        "name": "read_screen",
        "title": "Read a computer's screen",
        "description": (
            "Read the text on a computer's terminal screen, line by line, with its size and "
            "the cursor position. " + _allow("screen")
        ),
        "inputSchema": _schema({}),
        "annotations": {"readOnlyHint": True},
    },
]
TOOL_NAMES = frozenset(tool["name"] for tool in TOOLS)

INSTRUCTIONS = (
    "These tools act on ComputerCraft (CraftOS) computers in a Minecraft world, connected "
    "to this gateway. Call list_computers first. Each computer's player decides what it "
    'allows ("sandbox allow exec,eval,fs.read,fs.write,screen" on it); a refused call says '
    "which capability to ask the player for."
)


class _ToolError(Exception):
    """A tool call that ends as an ``isError`` result: an outcome and what to tell the model."""

    def __init__(self, outcome: str, text: str) -> None:
        super().__init__(text)
        self.outcome = outcome
        self.text = text


class _Invalid(Exception):
    """A JSON-RPC error for one message: code, message, HTTP status."""

    def __init__(self, code: int, message: str, status: int = 200) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


# -- The computer argument ---------------------------------------------------------------


def _split(trapos_id: str) -> tuple[str, str]:
    number, _, label = trapos_id.partition(":")
    return number, label


def _sessions(registry: Registry, account_id: str | None) -> list[Session]:
    """The account's computers (None: every account's), by traposId."""
    return sorted(registry.of_account(account_id), key=lambda s: (s.trapos_id, s.account_id))


@attrs.frozen
class _Remote:
    """A computer another gateway process holds (cluster mode), as its listing says."""

    trapos_id: str
    account_id: str
    capabilities: frozenset[str]
    version: str | None


def _remote(entry: dict[str, Any]) -> _Remote:
    return _Remote(
        str(entry.get("traposId")),
        str(entry.get("accountId")),
        frozenset(entry.get("capabilities") or ()),
        entry.get("version"),
    )


def _several_accounts(sessions: list[Session]) -> bool:
    """Whether names must say the account (the admin sees more than one)."""
    return len({s.account_id for s in sessions}) > 1


def _name(session: Session, every_account: bool) -> str:
    return (
        f"{session.trapos_id} (account {session.account_id})"
        if every_account
        else (session.trapos_id)
    )


def resolve(
    registry: Registry,
    computer: object,
    account_id: str | None = LOCAL_ACCOUNT,
    sessions: list[Any] | None = None,
) -> Session:
    """
    The session ``computer`` names (SPEC §10) among ``account_id``'s computers
    (None: every account's, for the admin) or among ``sessions`` when given,
    or a ``_ToolError`` saying why not.
    """
    if sessions is None:
        sessions = _sessions(registry, account_id)
    every = _several_accounts(sessions)
    known = ", ".join(_name(s, every) for s in sessions) or "none"
    if computer is None or computer == "":
        if len(sessions) == 1:
            return sessions[0]
        if not sessions:
            raise _ToolError(
                wire.NOT_CONNECTED,
                "No computer is connected to the gateway. A computer connects once the "
                "trapsandbox client is installed and running on it.",
            )
        raise _ToolError(
            AMBIGUOUS,
            f"{len(sessions)} computers are connected: {known}. Say which one with the "
            "computer argument (a traposId, id or label).",
        )
    if type(computer) is not str:
        raise _ToolError(INVALID_ARGUMENTS, 'computer must be a string, e.g. "7:base" or "7"')
    matches = [s for s in sessions if s.trapos_id == computer]
    if ":" not in computer:
        matches = [s for s in sessions if _split(s.trapos_id)[0] == computer]
        if not matches:
            matches = [s for s in sessions if _split(s.trapos_id)[1] == computer]
    if len(matches) == 1:
        return matches[0]
    if matches:
        candidates = ", ".join(_name(s, every) for s in matches)
        hint = (
            "Add ?account=NAME to the MCP URL to use one account's computers."
            if len({s.trapos_id for s in matches}) == 1
            else "Give the traposId of the one you mean as computer."
        )
        raise _ToolError(
            AMBIGUOUS,
            f'"{wire.cut(computer)}" matches {len(matches)} computers: {candidates}. {hint}',
        )
    raise _ToolError(
        wire.NOT_CONNECTED,
        f'No connected computer is "{wire.cut(computer)}". Connected: {known}. Call list_computers '
        "to see them.",
    )


def _pinned(registry: Registry, scope: tuple[str, str]) -> Session:
    """The asking computer of an ask's token (SPEC §11), connected or not."""
    account_id, trapos_id = scope
    for session in _sessions(registry, account_id):
        if session.trapos_id == trapos_id:
            return session
    raise _ToolError(
        wire.NOT_CONNECTED,
        f"{trapos_id}, the computer you are working for, is not connected any more.",
    )


# -- Arguments ---------------------------------------------------------------------------


def _string(arguments: dict[str, Any], name: str, empty: bool = False) -> str:
    value = arguments.get(name)
    if type(value) is not str or (not empty and not value):
        raise _ToolError(INVALID_ARGUMENTS, f"{name} is required: a non-empty string")
    return value


def _strings(arguments: dict[str, Any], name: str) -> list[str]:
    try:
        value = arguments.get(name)
        return [] if value is None else wire.string_list(value)
    except TypeError:
        raise _ToolError(INVALID_ARGUMENTS, f"{name} must be a list of strings") from None


def _run_seconds(arguments: dict[str, Any]) -> float:
    value = arguments.get("timeoutSeconds")
    if value is None:
        return limits.DEFAULT_RUN_TIMEOUT_MS / 1000
    if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
        raise _ToolError(INVALID_ARGUMENTS, "timeoutSeconds must be a number of seconds above 0")
    # A longer run would outlive the call: run it as long as a call may take.
    return min(float(value), limits.MCP_MAX_RUN_SECONDS)


# -- Results -----------------------------------------------------------------------------


def _result(text: str, structured: dict[str, Any] | None, error: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
    if structured is not None:
        result["structuredContent"] = structured
    if error:
        result["isError"] = True
    return result


_ADVICE = {
    wire.NOT_CONNECTED: "Call list_computers to see which computers are connected now.",
    wire.TIMEOUT: (
        "The computer may be busy, unloaded or lagging; try again, or with a shorter task."
    ),
    wire.FS_ERROR: (
        "CraftOS refused it. Paths are absolute from /; /rom is read-only; the disk holds "
        "about 1 MB; list_files shows what is there."
    ),
    wire.UNKNOWN_TYPE: (
        "The computer runs an older trapsandbox client without this; the player can reinstall "
        "it with the gateway's installer."
    ),
    wire.OVERLOADED: "The computer has too much to do; wait for its other requests and retry.",
    wire.TOO_LARGE: "Send less at once: at most 1 MiB of file content in one call.",
}


def _gateway_error_text(error: GatewayError, session: Session | None) -> str:
    name = session.trapos_id if session is not None else "the computer"
    if error.code == wire.FORBIDDEN and "sandbox allow" in error.message:
        # The message names the capability and the command: "computer 7:base has not
        # allowed exec: on it, run "sandbox allow exec"".  (A refusal no command lifts,
        # such as the settings file's, is told as it is, below.)
        return (
            f"Refused: {error.message}. Only the player at {name} can allow it; ask them to "
            "run that command on the computer, then call this tool again."
        )
    advice = _ADVICE.get(error.code, "")
    return f"{name}: {error.code}: {error.message}. {advice}".rstrip()


def _output_text(answer: dict[str, Any], header: str, ran_for: float) -> str:
    parts = [header]
    if answer.get("timedOut"):
        parts.append(f"It was stopped after {ran_for:g} s (timed out); the output so far:")
    for name in ("stdout", "stderr"):
        value = answer.get(name)
        if isinstance(value, str) and value:
            parts.append(f"--- {name} ---\n{value.rstrip(chr(10))}")
            if answer.get(f"{name}Truncated"):
                parts.append(f"({name} was cut short: too much output)")
    if len(parts) == 1 or (len(parts) == 2 and answer.get("timedOut")):
        parts.append("(no output)")
    return "\n".join(parts)


class McpEndpoint:
    """The ``/mcp`` endpoint's JSON-RPC handler; ``post`` answers one HTTP request."""

    def __init__(
        self,
        registry: Registry,
        sandbox: Sandbox,
        metrics: Metrics,
        clock: IReactorTime | None = None,
    ) -> None:
        self._registry = registry
        self._sandbox = sandbox
        self._metrics = metrics
        metrics.mcp_labels(TOOL_NAMES, OUTCOMES)
        self._clock = registry.clock if clock is None else clock
        self._tools: dict[str, Callable[[Session, dict[str, Any]], Coroutine]] = {
            "run_command": self._run_command,
            "run_lua": self._run_lua,
            "list_files": self._list_files,
            "read_file": self._read_file,
            "write_file": self._write_file,
            "delete_file": self._delete_file,
            "read_screen": self._read_screen,
        }

    # -- HTTP ------------------------------------------------------------------------------

    def post(
        self,
        request: IRequest,
        body: bytes | None,
        too_large: str | None = None,
        scope: str | None = LOCAL_ACCOUNT,
        pin: tuple[str, str] | None = None,
    ):
        """
        The answer to ``POST /mcp`` with ``body`` (None and ``too_large``: it was
        refused); the tools reach the computers of the account ``scope`` (None:
        every account's), or with ``pin``, the (account, traposId) an ask's token
        is for, that computer only, whatever ``computer`` says.
        """
        if body is None:
            return _reply(request, _error(None, INVALID_REQUEST, too_large or "too large"), 413)
        try:
            message = orjson.loads(body)
        except orjson.JSONDecodeError as error:
            return _reply(request, _error(None, PARSE_ERROR, f"the body is not JSON: {error}"), 400)
        try:
            return self._message(request, message, scope, pin)
        except _Invalid as invalid:
            return _reply(request, _error(None, invalid.code, invalid.message), invalid.status)

    def _message(
        self,
        request: IRequest,
        message: Any,
        scope: str | None,
        pin: tuple[str, str] | None = None,
    ):
        if type(message) is list:
            raise _Invalid(
                INVALID_REQUEST,
                "JSON-RPC batches are not supported (MCP removed them in 2025-06-18): "
                "send one message per POST",
                400,
            )
        if type(message) is not dict:
            raise _Invalid(INVALID_REQUEST, "a JSON-RPC message must be a JSON object", 400)
        if message.get("jsonrpc") != "2.0":
            raise _Invalid(INVALID_REQUEST, 'jsonrpc must be "2.0"', 400)
        method = message.get("method")
        if "method" not in message:
            if "id" in message and ("result" in message or "error" in message):
                return _accepted(request)  # a response: we never ask, so nothing waits for it
            raise _Invalid(INVALID_REQUEST, "a JSON-RPC request needs a method", 400)
        if type(method) is not str:
            raise _Invalid(INVALID_REQUEST, "method must be a string", 400)
        if "id" not in message:
            return _accepted(request)  # notifications/initialized, cancelled, …: nothing to say
        id = message["id"]
        if not (type(id) is str or (type(id) is int and -_MAX_INT_ID <= id < _MAX_INT_ID)):
            raise _Invalid(INVALID_REQUEST, "id must be a string or an integer", 400)
        version = request.getHeader(b"mcp-protocol-version")
        if (
            method != "initialize"
            and version is not None
            and version.decode("latin-1") not in PROTOCOL_VERSIONS
        ):
            raise _Invalid(
                INVALID_REQUEST,
                "unsupported MCP-Protocol-Version; this server speaks "
                + ", ".join(PROTOCOL_VERSIONS),
                400,
            )
        params = message.get("params")
        if params is None:
            params = {}
        elif type(params) is not dict:
            return _reply(request, _error(id, INVALID_PARAMS, "params must be an object"))
        d = Deferred.fromCoroutine(self._dispatch(method, params, scope, pin))
        d.addCallback(
            lambda result: _reply(request, {"jsonrpc": "2.0", "id": id, "result": result})
        )
        d.addErrback(self._failed, request, id)
        return d

    def _failed(self, failure: Failure, request: IRequest, id: Any) -> bytes | Failure:
        if failure.check(_Invalid):
            return _reply(request, _error(id, failure.value.code, failure.value.message))
        if failure.check(CancelledError):
            return failure  # the client went away: nobody to answer
        log.failure("MCP request failed", failure)
        return _reply(request, _error(id, INTERNAL_ERROR, "the gateway failed on this request"))

    # -- Methods ---------------------------------------------------------------------------

    async def _dispatch(
        self,
        method: str,
        params: dict[str, Any],
        scope: str | None,
        pin: tuple[str, str] | None = None,
    ) -> dict[str, Any]:
        if method == "initialize":
            return self._initialize(params)
        if method == "ping":
            return {}
        if method == "tools/list":
            return {"tools": TOOLS}
        if method == "tools/call":
            return await self._tools_call(params, scope, pin)
        raise _Invalid(METHOD_NOT_FOUND, f'no method "{wire.cut(method)}"')

    def _initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        asked = params.get("protocolVersion")
        if type(asked) is not str:
            raise _Invalid(INVALID_PARAMS, "initialize needs protocolVersion, a string")
        return {
            "protocolVersion": asked if asked in PROTOCOL_VERSIONS else LATEST,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "trapsandbox", "title": "trapsandbox", "version": __version__},
            "instructions": INSTRUCTIONS,
        }

    async def _tools_call(
        self, params: dict[str, Any], scope: str | None, pin: tuple[str, str] | None = None
    ) -> dict[str, Any]:
        name = params.get("name")
        if type(name) is not str:
            raise _Invalid(INVALID_PARAMS, "tools/call needs name, a string")
        if name not in TOOL_NAMES:
            raise _Invalid(
                INVALID_PARAMS,
                f'no tool "{wire.cut(name)}"; the tools are ' + ", ".join(sorted(TOOL_NAMES)),
            )
        arguments = params.get("arguments")
        if arguments is None:
            arguments = {}
        elif type(arguments) is not dict:
            raise _Invalid(INVALID_PARAMS, "arguments must be an object")
        started = self._clock.seconds()
        computer = arguments.get("computer")
        target = wire.cut(computer) if type(computer) is str and computer else "-"
        try:
            if name == "list_computers":
                result, outcome = self._list_computers(await self._computers(scope, pin)), "ok"
            else:
                if pin is None:
                    session = resolve(self._registry, computer, scope, await self._computers(scope))
                else:
                    session = _pinned(self._registry, pin)
                target = session.trapos_id
                result, outcome = await self._tools[name](session, arguments)
        except _ToolError as error:
            outcome = error.outcome
            result = _result(error.text, {"ok": False, "code": outcome}, error=True)
        seconds = self._clock.seconds() - started
        self._metrics.mcp_tool_call(name, outcome, seconds)
        log.info(
            "MCP {tool} on {computer}: {outcome} in {seconds:.3f} s",
            tool=name,
            computer=target,
            outcome=outcome,
            seconds=seconds,
        )
        return result

    # -- Tools -----------------------------------------------------------------------------

    def _bounded(self, d: Deferred) -> Deferred:
        # Cancelling the request cancels a run on the computer.
        return d.addTimeout(limits.MCP_CALL_TIMEOUT, self._clock)

    async def _call(self, session: Session, d: Deferred) -> dict[str, Any]:
        """The answer ``d`` fires with, or a ``_ToolError`` for the model."""
        try:
            return await self._bounded(d)
        except GatewayError as error:
            raise _ToolError(error.code, _gateway_error_text(error, session)) from None
        except TimeoutError:
            raise _ToolError(
                wire.TIMEOUT,
                f"{session.trapos_id} did not finish within {limits.MCP_CALL_TIMEOUT:g} s; "
                "the request was cancelled on it. " + _ADVICE[wire.TIMEOUT],
            ) from None

    async def _computers(self, scope: str | None, pin: tuple[str, str] | None = None) -> list:
        """
        The computers the tools may name: ``scope``'s here and, in cluster mode,
        on the other gateway processes; only the asking one for an ask's token.
        """
        if pin is not None:
            return [s for s in _sessions(self._registry, pin[0]) if s.trapos_id == pin[1]]
        found: list[Any] = _sessions(self._registry, scope)
        listing = getattr(self._registry.peers, "computers", None)
        if listing is not None:
            others = await listing([])  # the other processes' computers only
            found += [
                _remote(entry)
                for entry in others.get("computers", [])
                if scope is None or entry.get("accountId") == scope
            ]
            found.sort(key=lambda s: (s.trapos_id, s.account_id))
        return found

    def _list_computers(self, sessions: list[Any]) -> dict[str, Any]:
        every = _several_accounts(sessions)
        listed = []
        lines = []
        for session in sessions:
            number, label = _split(session.trapos_id)
            allowed = sorted(session.capabilities)
            listed.append(
                {
                    "traposId": session.trapos_id,
                    "id": number,
                    "label": label or None,
                    "capabilities": allowed,
                    "version": session.version,
                    "accountId": session.account_id,
                }
            )
            named = f'label "{label}"' if label else "no label"
            if every:
                named += f", account {session.account_id}"
            lines.append(
                f"- {session.trapos_id} (id {number}, {named}); allowed: "
                + (
                    ", ".join(allowed)
                    if allowed
                    else 'nothing (the player can run "sandbox allow …")'
                )
            )
        if not sessions:
            text = (
                "No computer is connected. A computer connects once the trapsandbox client "
                "is installed and running on it."
            )
        else:
            count = "1 computer" if len(sessions) == 1 else f"{len(sessions)} computers"
            text = f"{count} connected:\n" + "\n".join(lines)
        return _result(text, {"computers": listed})

    async def _run(
        self,
        session: Session,
        start: Callable[[float, Callable[[str, str], None]], Deferred],
        seconds: float,
    ) -> dict[str, Any]:
        """A run's answer; past the call's bound, what it printed so far and ``timedOut``."""
        heard = {"stdout_delta": [], "stderr_delta": []}

        def listen(kind: str, data: str) -> None:
            heard[kind].append(data)

        d = start(round(seconds * 1000), listen)
        try:
            return await self._call(session, d)
        except _ToolError as error:
            if error.outcome != wire.TIMEOUT or not any(heard.values()):
                raise
            return {
                "timedOut": True,
                "stdout": "".join(heard["stdout_delta"]),
                "stderr": "".join(heard["stderr_delta"]),
                "answered": False,
            }

    async def _run_command(self, session: Session, arguments: dict[str, Any]):
        command = _string(arguments, "command")
        args = _strings(arguments, "args")
        seconds = _run_seconds(arguments)
        answer = await self._run(
            session,
            lambda ms, listen: self._sandbox.execute(
                session.trapos_id,
                command,
                args,
                timeout_ms=ms,
                on_output=listen,
                account_id=session.account_id,
            ),
            seconds,
        )
        code = answer.get("exitCode")
        header = f"{command} on {session.trapos_id}: exit code {code if code is not None else '?'}"
        return _result(_output_text(answer, header, seconds), answer), "ok"

    async def _run_lua(self, session: Session, arguments: dict[str, Any]):
        code = _string(arguments, "code")
        seconds = _run_seconds(arguments)
        answer = await self._run(
            session,
            lambda ms, listen: self._sandbox.eval(
                session.trapos_id,
                code,
                timeout_ms=ms,
                on_output=listen,
                account_id=session.account_id,
            ),
            seconds,
        )
        returns = answer.get("returns")
        if answer.get("ok") is False:
            error = answer.get("error") or "the code failed"
            header = f"The Lua code failed on {session.trapos_id}: {error}"
            text = _output_text({**answer, "stderr": None}, header, seconds)
            return _result(text, answer, error=True), LUA_ERROR
        if isinstance(returns, list) and returns:
            header = "Returned: " + ", ".join(str(value) for value in returns)
        elif answer.get("timedOut"):
            header = f"The Lua code on {session.trapos_id} did not finish."
        else:
            header = "Returned nothing."
        return _result(_output_text(answer, header, seconds), answer), "ok"

    async def _list_files(self, session: Session, arguments: dict[str, Any]):
        path = _string(arguments, "path")
        answer = await self._call(
            session,
            self._sandbox.list_files(session.trapos_id, path, account_id=session.account_id),
        )
        entries = answer.get("entries") if isinstance(answer.get("entries"), list) else []
        lines = []
        for entry in entries:
            if not isinstance(entry, dict):
                continue
            name = entry.get("name")
            if entry.get("type") == "dir":
                line = f"{name}/"
            else:
                line = f"{name}  {entry.get('size', '?')} bytes"
            if entry.get("readOnly"):
                line += "  (read-only)"
            lines.append(line)
        shown = answer.get("path", path)
        if lines:
            text = f"{shown} on {session.trapos_id}:\n" + "\n".join(lines)
        else:
            text = f"{shown} on {session.trapos_id} is empty."
        return _result(text, answer), "ok"

    async def _read_file(self, session: Session, arguments: dict[str, Any]):
        path = _string(arguments, "path")
        answer = await self._call(
            session,
            self._sandbox.read_file(session.trapos_id, path, account_id=session.account_id),
        )
        content: bytes = answer["content"]
        try:
            text, encoding = content.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            text, encoding = base64.b64encode(content).decode("ascii"), "base64"
        size = answer.get("sizeBytes", len(content))
        what = "UTF-8 text" if encoding == "utf-8" else "not UTF-8, so in base64"
        header = f"{path} on {session.trapos_id}: {size} bytes, {what}"
        if len(content) < size:
            header += f" (only the first {len(content)} bytes)"
        structured = {**answer, "path": path, "content": text, "encoding": encoding}
        return _result(f"{header}:\n{text}", structured), "ok"

    async def _write_file(self, session: Session, arguments: dict[str, Any]):
        path = _string(arguments, "path")
        data = _string(arguments, "content", empty=True).encode("utf-8", "surrogatepass")
        if len(data) > limits.MAX_FILE_BYTES:
            raise _ToolError(
                wire.TOO_LARGE,
                f"content is {len(data)} bytes; at most {limits.MAX_FILE_BYTES} can be written "
                "in one call (and the disk holds about 1 MB)",
            )
        answer = await self._call(
            session,
            self._sandbox.write_file(session.trapos_id, path, data, account_id=session.account_id),
        )
        text = (
            f"Wrote {answer.get('bytesWritten', len(data))} bytes to {path} on {session.trapos_id}."
        )
        return _result(text, answer), "ok"

    async def _delete_file(self, session: Session, arguments: dict[str, Any]):
        path = _string(arguments, "path")
        answer = await self._call(
            session,
            self._sandbox.delete_file(session.trapos_id, path, account_id=session.account_id),
        )
        if answer.get("deleted"):
            text = f"Deleted {path} on {session.trapos_id}."
        else:
            text = f"Nothing was deleted: {path} does not exist on {session.trapos_id}."
        return _result(text, answer), "ok"

    async def _read_screen(self, session: Session, arguments: dict[str, Any]):
        answer = await self._call(
            session, self._sandbox.screen(session.trapos_id, account_id=session.account_id)
        )
        lines = answer.get("lines") if isinstance(answer.get("lines"), list) else []
        shown = "\n".join(str(line).rstrip() for line in lines)
        header = (
            f"The screen of {session.trapos_id} ({answer.get('width')}x{answer.get('height')}, "
            f"cursor at column {answer.get('cursorX')}, line {answer.get('cursorY')}):"
        )
        return _result(f"{header}\n{shown}", answer), "ok"


def _error(id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}


def _accepted(request: IRequest) -> bytes:
    request.setResponseCode(202)
    return b""


def _reply(request: IRequest, message: dict[str, Any], status: int = 200) -> bytes:
    try:
        body = orjson.dumps(message)
    except orjson.JSONEncodeError:
        # A computer's answer too deep for orjson to write (it reads deeper than it writes):
        # the text is all a model needs.
        result = message.get("result")
        if isinstance(result, dict) and "structuredContent" in result:
            result = {k: v for k, v in result.items() if k != "structuredContent"}
            return _reply(request, {**message, "result": result}, status)
        body = orjson.dumps(_error(message.get("id"), INTERNAL_ERROR, "the answer cannot be sent"))
    request.setResponseCode(status)
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-store")
    return body
