"""
The opencode side of ``sandbox ask`` (SPEC §11): sessions, prompts and the
one event stream the whole gateway shares.

    computer                      gateway                          opencode
    ask {prompt, new?, yes?}  ->  (first ask of a computer)
                                  POST /mcp?directory=D            the computer's own MCP block
                                  POST /session?directory=D        rules: ask before changes
                                  POST /session/S/prompt_async ->  204
                                                               <-  GET /global/event (SSE)
          <- partial {type: text_delta, text}                      message.part.delta
          <- partial {type: tool, name, status}                    message.part.updated (tool)
          <- partial {type: permission, id, tool, detail}          permission.asked
    ask_permission {permissionId, response} -> POST /permission/P/reply
    cancel {messageId}        ->  POST /session/S/abort
          <- final {sessionId, text}                               session.idle

Confinement.  opencode keeps one instance per ``directory`` query parameter,
each with its own MCP connections.  Every computer's sessions live in a
directory of their own (under ``ask_directory``, made and opened as
``trapsandbox.state`` says: 0700, ours, never through a symbolic link), whose
instance is given a ``trapsandbox`` MCP server (``POST /mcp?directory=D``, the
same name as the operator's, so it replaces it there and the tools keep their
names) whose bearer token is minted for that computer alone.  ``/mcp`` serves such a
token with every tool pinned to that computer, whatever ``computer`` the
model names (``trapsandbox.mcp.endpoint``).  The same block is written to the
directory's ``opencode.json``, so an instance opencode re-creates reads it
too.  The session's permission rules deny every other tool (opencode's own
bash, edit, … act on the host, not on the computer).

What is remembered per computer (its conversation, its token, whether its
directory's instance has the block) is bounded per account: past
``max_conversations`` the least recently used computer's is forgotten (its
token stops working; its next ask starts a new session).

The event stream: one ``GET /global/event`` for the whole gateway (``/event``
carries one directory's instance only; the global stream wraps every
instance's events as ``{directory, payload}``), opened with the
first ask and kept, reconnected with backoff (1 s doubling to 30 s) when it
drops or falls silent past opencode's heartbeat; events are dispatched by
``sessionID``.  After a reconnect, every running ask asks opencode whether
its session is still busy (events in the gap are lost) and ends if not.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Callable
from typing import Any

import attrs
import orjson
import treq
from hyperlink import DecodedURL
from twisted.internet.defer import Deferred, succeed
from twisted.internet.error import ConnectError, ConnectionRefusedError, DNSLookupError
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed

from trapsandbox import limits
from trapsandbox.computers import wire
from trapsandbox.computers.wire import GatewayError, cut
from trapsandbox.opencode.probe import redact
from trapsandbox.ops.metrics import Metrics
from trapsandbox.state import Unsafe, private_directory, write_private

log = Logger()

# The tools that change the computer: opencode asks the player before each (unless --yes).
CHANGING_TOOLS = (
    "trapsandbox_run_command",
    "trapsandbox_run_lua",
    "trapsandbox_write_file",
    "trapsandbox_delete_file",
)
READING_TOOLS = (
    "trapsandbox_list_computers",
    "trapsandbox_list_files",
    "trapsandbox_read_file",
    "trapsandbox_read_screen",
)


def session_rules(yes: bool) -> list[dict[str, str]]:
    """
    An ask session's permission rules (the last match wins): nothing but the
    computer's tools (opencode's own bash, edit, … act on the host); reading
    is free; a change is asked for unless ``yes``.  (A prompt's ``tools`` map
    would not do: opencode turns its ``true`` entries into ``allow`` rules that
    override the session's ``ask``.)
    """
    change = "allow" if yes else "ask"
    return [
        {"permission": "*", "pattern": "*", "action": "deny"},
        *({"permission": name, "pattern": "*", "action": "allow"} for name in READING_TOOLS),
        *({"permission": name, "pattern": "*", "action": change} for name in CHANGING_TOOLS),
    ]


PERMISSION_REPLIES = ("once", "always", "reject")
MCP_NAME = "trapsandbox"

# Outcomes of an ask (metrics labels).
ASK_OUTCOMES = ("ok", "cancelled", "timeout", "opencode_error", "run_failed", "disconnected")


def opencode_error(message: str) -> GatewayError:
    return GatewayError(wire.OPENCODE_ERROR, message)


# -- Server-sent events ----------------------------------------------------------------


class SSEParser:
    """
    Bytes of a ``text/event-stream`` in, one decoded JSON object per event out.

    opencode sends ``data:`` lines only; ``event:``, ``id:`` and comments are
    skipped, data that is not a JSON object is dropped, and so is a line over
    ``max_line`` bytes.
    """

    def __init__(
        self, on_event: Callable[[dict[str, Any]], None], max_line: int = limits.MAX_EVENT_BYTES
    ) -> None:
        self._on_event = on_event
        self._max_line = max_line
        self._buffer = b""
        self._data: list[bytes] = []
        self._skipping = False

    def feed(self, data: bytes) -> None:
        buffer = self._buffer + data
        lines = buffer.split(b"\n")
        self._buffer = lines.pop()
        if len(self._buffer) > self._max_line:
            self._buffer = b""
            self._skipping = True
        for line in lines:
            if self._skipping:
                self._skipping = False  # the end of the overlong line
                continue
            self._line(line.removesuffix(b"\r"))

    def _line(self, line: bytes) -> None:
        if not line:
            if self._data:
                data, self._data = b"\n".join(self._data), []
                self._dispatch(data)
            return
        if line.startswith(b"data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(b" ") else value)

    def _dispatch(self, data: bytes) -> None:
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if type(event) is dict:
            self._on_event(event)


# -- HTTP ------------------------------------------------------------------------------


def explain(failure: Failure, where: str) -> GatewayError:
    """A failed exchange with opencode as an ``opencode_error`` a player can act on."""
    if failure.check(GatewayError):
        return failure.value
    if failure.check(ConnectionRefusedError):
        reason = "connection refused: is opencode running?"
    elif failure.check(DNSLookupError):
        reason = "host name not found"
    elif failure.check(ConnectError):
        reason = f"cannot connect: {cut(failure.getErrorMessage())}"
    elif failure.check(ResponseFailed):
        reason = "the connection closed before a complete answer"
    else:
        from twisted.internet.defer import TimeoutError

        if failure.check(TimeoutError):
            reason = "no answer in time"
        else:
            reason = cut(failure.getErrorMessage() or failure.type.__name__)
    return opencode_error(f"opencode at {where}: {reason}")


class OpencodeClient:
    """opencode's HTTP API as far as ``ask`` needs it; every call is bounded."""

    def __init__(
        self,
        http: Any,
        clock: IReactorTime,
        url: str,
        username: str = limits.DEFAULT_OPENCODE_USERNAME,
        password: str | None = None,
        timeout: float = limits.ASK_CALL_TIMEOUT,
    ) -> None:
        self.http = http
        self._clock = clock
        self.url = url.rstrip("/")
        self.where = redact(self.url)
        self.auth = (username, password) if password else None
        self._timeout = timeout

    def target(self, path: str, directory: str | None = None) -> DecodedURL:
        url = DecodedURL.from_text(self.url + path)
        return url.add("directory", directory) if directory else url

    def call(
        self, method: str, path: str, body: Any = None, directory: str | None = None
    ) -> Deferred:
        """Fires with the decoded JSON answer (None for an empty one) or an ``opencode_error``."""
        kwargs: dict[str, Any] = {"auth": self.auth, "allow_redirects": False}
        if body is not None:
            kwargs["data"] = orjson.dumps(body)
            kwargs["headers"] = {b"Content-Type": [b"application/json"]}
        d = self.http.request(method, self.target(path, directory), **kwargs)
        d.addCallback(self._read, method, path)
        d.addTimeout(self._timeout, self._clock)
        d.addErrback(lambda failure: _fail(explain(failure, self.where)))
        return d

    def _read(self, response, method: str, path: str) -> Deferred:
        d = treq.content(response)
        d.addCallback(self._judge, response, method, path)
        return d

    def _judge(self, body: bytes, response, method: str, path: str) -> Any:
        code = response.code
        if code == 401:
            raise opencode_error(
                f"opencode at {self.where} answered 401 Unauthorized: check "
                "OPENCODE_SERVER_PASSWORD and OPENCODE_SERVER_USERNAME"
            )
        if not 200 <= code < 300:
            raise opencode_error(
                f"opencode at {self.where} answered HTTP {code} to {method} {cut(path)}"
                + _detail_of(body)
            )
        if not body.strip():
            return None
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            raise opencode_error(
                f"opencode at {self.where} answered {method} {cut(path)} with something not JSON: "
                "is OPENCODE_URL an opencode server?"
            ) from None

    # The calls

    def config(self) -> Deferred:
        return self.call("GET", "/config")

    def add_mcp(self, directory: str, name: str, server: dict[str, Any]) -> Deferred:
        return self.call("POST", "/mcp", {"name": name, "config": server}, directory)

    def create_session(
        self, directory: str, title: str, permission: list[dict[str, str]]
    ) -> Deferred:
        return self.call("POST", "/session", {"title": title, "permission": permission}, directory)

    def prompt_async(self, directory: str, session_id: str, text: str, system: str) -> Deferred:
        body = {"parts": [{"type": "text", "text": text}], "system": system}
        return self.call("POST", f"/session/{session_id}/prompt_async", body, directory)

    def abort(self, directory: str, session_id: str) -> Deferred:
        return self.call("POST", f"/session/{session_id}/abort", None, directory)

    def reply_permission(self, directory: str, permission_id: str, reply: str) -> Deferred:
        return self.call("POST", f"/permission/{permission_id}/reply", {"reply": reply}, directory)

    def message(self, directory: str, session_id: str, message_id: str) -> Deferred:
        """``{info, parts}`` of one message of a session."""
        return self.call("GET", f"/session/{session_id}/message/{message_id}", None, directory)

    def statuses(self, directory: str) -> Deferred:
        """``{sessionID: {type: busy|idle|retry}}`` of the busy sessions."""
        return self.call("GET", "/session/status", None, directory)


def _fail(error: Exception) -> Failure:
    return Failure(error)


def _detail_of(body: bytes) -> str:
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    if isinstance(answer, dict):
        data = answer.get("data")
        message = data.get("message") if isinstance(data, dict) else answer.get("message")
        if isinstance(message, str) and message:
            return ": " + cut(message)
    return ""


# -- The event stream --------------------------------------------------------------------


class _StreamBody(Protocol):
    def __init__(self, stream: EventStream) -> None:
        self._stream = stream
        self.ended: Deferred = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self._stream.received(data)

    def connectionLost(self, reason: Failure = ResponseDone) -> None:
        self.ended.callback(None)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.stopProducing()


class EventStream:
    """
    The one ``GET /global/event`` of the gateway.  ``subscribe(sessionID, listener)``
    hears that session's events; ``ready()`` fires once connected (or fails
    with an ``opencode_error``); ``on_reconnect`` listeners run after every
    reconnection.
    """

    def __init__(
        self,
        client: OpencodeClient,
        clock: IReactorTime,
        silence: float = limits.EVENT_SILENCE_TIMEOUT,
    ) -> None:
        self._client = client
        self._clock = clock
        self._silence = silence
        self._listeners: dict[str, Callable[[dict[str, Any]], None]] = {}
        self.on_reconnect: list[Callable[[], None]] = []
        self.connected = False
        self.connects = 0
        self._connecting: Deferred | None = None
        self._body: _StreamBody | None = None
        self._waiters: list[Deferred] = []
        self._retry = None
        self._watchdog = None
        self._backoff = limits.EVENT_RECONNECT_MIN
        self._stopped = False
        self._parser = SSEParser(self._event)

    def subscribe(self, session_id: str, listener: Callable[[dict[str, Any]], None]):
        self._listeners[session_id] = listener

        def unsubscribe() -> None:
            if self._listeners.get(session_id) is listener:
                del self._listeners[session_id]

        return unsubscribe

    def ready(self) -> Deferred:
        if self.connected:
            return succeed(None)
        d = Deferred()
        self._waiters.append(d)
        if self._connecting is None:
            if self._retry is not None and self._retry.active():
                self._retry.cancel()
            self._retry = None
            self._connect()
        return d

    def stop(self) -> None:
        self._stopped = True
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._cancel_watchdog()
        if self._body is not None:
            self._body.abort()
        if self._connecting is not None:
            self._connecting.cancel()

    def _connect(self) -> None:
        self._parser = SSEParser(self._event)
        d = self._client.http.get(
            self._client.target("/global/event"),
            auth=self._client.auth,
            headers={b"Accept": [b"text/event-stream"]},
            unbuffered=True,
            allow_redirects=False,
        )
        d.addTimeout(limits.OPENCODE_CONNECT_TIMEOUT + limits.PROBE_TIMEOUT, self._clock)
        self._connecting = d
        d.addCallbacks(self._opened, self._failed)

    def _opened(self, response) -> None:
        self._connecting = None
        if response.code != 200:
            treq.content(response).addErrback(lambda _: None)
            if response.code == 401:
                error = opencode_error(
                    f"opencode at {self._client.where} answered 401 Unauthorized: check "
                    "OPENCODE_SERVER_PASSWORD and OPENCODE_SERVER_USERNAME"
                )
            else:
                error = opencode_error(
                    f"opencode at {self._client.where} answered HTTP {response.code} to GET /event"
                )
            self._down(error)
            return
        body = _StreamBody(self)
        self._body = body
        response.deliverBody(body)
        body.ended.addCallback(self._ended, body)
        self.connected = True
        self.connects += 1
        self._backoff = limits.EVENT_RECONNECT_MIN
        self._arm_watchdog()
        if self.connects > 1:
            log.info("the opencode event stream is back")
            for listener in list(self.on_reconnect):
                try:
                    listener()
                except Exception:
                    log.failure("an event stream reconnect listener failed")
        waiters, self._waiters = self._waiters, []
        for d in waiters:
            d.callback(None)

    def _failed(self, failure: Failure) -> None:
        self._connecting = None
        if self._stopped:
            return
        self._down(explain(failure, self._client.where))

    def _down(self, error: GatewayError) -> None:
        waiters, self._waiters = self._waiters, []
        for d in waiters:
            d.errback(error)
        self._schedule()

    def _ended(self, _: None, body: _StreamBody) -> None:
        if self._body is body:
            self._body = None
        self.connected = False
        self._cancel_watchdog()
        if not self._stopped:
            log.info("the opencode event stream ended; reconnecting")
            self._schedule()

    def _schedule(self) -> None:
        if self._stopped or (self._retry is not None and self._retry.active()):
            return
        delay, self._backoff = (
            self._backoff,
            min(self._backoff * 2, limits.EVENT_RECONNECT_MAX),
        )
        self._retry = self._clock.callLater(delay, self._reconnect)

    def _reconnect(self) -> None:
        self._retry = None
        if self._connecting is None and not self.connected:
            self._connect()

    def received(self, data: bytes) -> None:
        self._arm_watchdog()
        self._parser.feed(data)

    def _arm_watchdog(self) -> None:
        if self._watchdog is not None and self._watchdog.active():
            self._watchdog.reset(self._silence)
        else:
            self._watchdog = self._clock.callLater(self._silence, self._silent)

    def _cancel_watchdog(self) -> None:
        if self._watchdog is not None and self._watchdog.active():
            self._watchdog.cancel()
        self._watchdog = None

    def _silent(self) -> None:
        self._watchdog = None
        log.info("the opencode event stream fell silent; reconnecting")
        if self._body is not None:
            self._body.abort()

    def _event(self, event: dict[str, Any]) -> None:
        # /global/event wraps each instance's event: {directory, payload: {id, type, properties}}.
        payload = event.get("payload")
        if type(payload) is dict:
            event = payload
        properties = event.get("properties")
        if type(properties) is not dict:
            return
        session_id = properties.get("sessionID")
        if session_id is None:
            info = properties.get("info")
            part = properties.get("part")
            holder = info if type(info) is dict else part if type(part) is dict else {}
            session_id = holder.get("sessionID")
        listener = self._listeners.get(session_id) if type(session_id) is str else None
        if listener is not None:
            try:
                listener(event)
            except Exception:
                log.failure("handling an opencode event failed")


# -- Asks ------------------------------------------------------------------------------


Emit = Callable[[dict[str, Any]], None]


@attrs.define(eq=False)
class Conversation:
    """The opencode session of one computer."""

    session_id: str
    directory: str
    yes: bool


@attrs.define(eq=False)
class Run:
    """One ask in flight."""

    key: tuple[str, str]
    message_id: str
    conversation: Conversation
    emit: Emit
    done: Deferred
    started: bool = False
    error: dict[str, Any] | None = None
    aborted: bool = False
    roles: dict[str, str] = attrs.field(factory=dict)
    texts: dict[str, str] = attrs.field(factory=dict)  # partID -> text so far, in order
    sent: dict[str, int] = attrs.field(factory=dict)  # partID -> characters forwarded
    tools: dict[str, dict[str, Any]] = attrs.field(factory=dict)  # callID -> {name, input}
    tool_status: dict[str, str] = attrs.field(factory=dict)
    tokens: dict[str, tuple[int, int]] = attrs.field(factory=dict)  # messageID -> (in, out)
    permissions: set[str] = attrs.field(factory=set)
    # permission.asked whose tool input is not known yet: permissionID -> (event, timer)
    pending: dict[str, tuple[dict[str, Any], Any]] = attrs.field(factory=dict)
    flush_timer: Any = None
    bound: Any = None
    unsubscribe: Callable[[], None] | None = None
    finished: bool = False


def _directory_name(account_id: str, trapos_id: str) -> str:
    """
    A computer's ask directory: its number (for a reader of the folder) and a
    digest of the account and traposId, so neither can put a ``/`` or ``..``
    into the path.  Not a secret: the parent is 0700.
    """
    number = trapos_id.partition(":")[0]
    if not (number.isascii() and number.isdigit() and len(number) <= 16):
        number = "x"
    digest = hashlib.sha256(f"{account_id}\0{trapos_id}".encode()).hexdigest()[:16]
    return f"{number}-{digest}"


def system_note(trapos_id: str, capabilities: frozenset[str]) -> str:
    allowed = ", ".join(sorted(capabilities)) or "nothing yet"
    return (
        f"You are talking to the player at the ComputerCraft computer {trapos_id} (CraftOS, "
        "Lua 5.2, in a Minecraft world); your answer is shown on its small terminal, so keep "
        f"it short and plain. The trapsandbox_* tools act on this computer (computer = "
        f'"{trapos_id}") and only on it. Its player allowed: {allowed}; a tool that needs '
        'more says so, and the player can run "sandbox allow CAP" on the computer. The '
        "player is asked before each change you make and may refuse it."
    )


def detail_of(tool: str, arguments: Any) -> str:
    """What a permission prompt shows: the command line, the first lines of code, the path."""
    if type(arguments) is not dict:
        arguments = {}
    short = tool.removeprefix(MCP_NAME + "_")
    if short == "run_command":
        args = arguments.get("args")
        words = [str(arguments.get("command", "?"))]
        if isinstance(args, list):
            words += [str(a) for a in args]
        text = " ".join(words)
    elif short == "run_lua":
        text = "\n".join(str(arguments.get("code", "")).splitlines()[:3])
    elif "path" in arguments:
        text = str(arguments["path"])
        if short == "write_file" and isinstance(arguments.get("content"), str):
            text += f" ({len(arguments['content'].encode('utf-8', 'surrogatepass'))} bytes)"
    else:
        text = orjson.dumps(arguments).decode()
    limit = limits.PERMISSION_DETAIL_CHARS
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Asks:
    """Every computer's opencode session and its ask: what ``ask``, ``cancel`` and
    ``ask_permission`` do."""

    def __init__(
        self,
        client: OpencodeClient,
        clock: IReactorTime,
        metrics: Metrics | None = None,
        *,
        directory: str,
        stream: EventStream | None = None,
        timeout: float = limits.ASK_TIMEOUT,
        max_conversations: int = limits.MAX_ASK_CONVERSATIONS,
    ) -> None:
        self._client = client
        self._clock = clock
        self._metrics = Metrics() if metrics is None else metrics
        self._metrics.ask_labels(ASK_OUTCOMES)
        # A private directory (``state.prepare``, at start).  opencode resolves a
        # relative directory against its own working directory: give it an absolute one.
        self.root = os.path.abspath(directory)
        self.stream = EventStream(client, clock) if stream is None else stream
        self.stream.on_reconnect.append(self._reconnected)
        self._timeout = timeout
        self._max_conversations = max_conversations
        # account -> its computers' traposIds, the least recently asked first.
        self._recent: dict[str, dict[str, None]] = {}
        self._tokens: dict[str, tuple[str, str]] = {}  # sha256(token) -> (account, traposId)
        self._token_of: dict[tuple[str, str], str] = {}
        self._scoped: set[tuple[str, str]] = set()  # computers whose instance has our MCP block
        self.conversations: dict[tuple[str, str], Conversation] = {}
        self.runs: dict[tuple[str, str], Run] = {}
        self._by_permission: dict[str, Run] = {}

    # -- Scoped MCP tokens -------------------------------------------------------------

    def scope_of(self, authorization: bytes | None) -> tuple[str, str] | None:
        """The (account, traposId) an ``Authorization`` header's ask token is for, or None."""
        if not authorization or not authorization.startswith(b"Bearer "):
            return None
        digest = hashlib.sha256(authorization[7:].strip()).hexdigest()
        return self._tokens.get(digest)

    def _token(self, key: tuple[str, str]) -> str:
        token = self._token_of.get(key)
        if token is None:
            token = "ask-" + secrets.token_urlsafe(32)
            self._token_of[key] = token
            self._tokens[hashlib.sha256(token.encode()).hexdigest()] = key
        return token

    # -- Remembered per computer, bounded per account ------------------------------------

    def _remember(self, key: tuple[str, str]) -> None:
        """``key`` was just asked for; forget its account's least recently used past the bound."""
        recent = self._recent.setdefault(key[0], {})
        recent.pop(key[1], None)
        recent[key[1]] = None
        if len(recent) <= self._max_conversations:
            return
        for trapos_id in list(recent):
            if len(recent) <= self._max_conversations:
                break
            if (key[0], trapos_id) not in self.runs:  # one asking now is kept
                del recent[trapos_id]
                self._forget((key[0], trapos_id))

    def _forget(self, key: tuple[str, str]) -> None:
        """Drop what is kept for ``key``: its session id, its token (revoked), its block's mark."""
        self.conversations.pop(key, None)
        token = self._token_of.pop(key, None)
        if token is not None:
            self._tokens.pop(hashlib.sha256(token.encode()).hexdigest(), None)
        self._scoped.discard(key)
        log.info(
            "forgot the ask conversation of {traposId} (account {account}): the account's "
            "{bound} most recently asked computers are kept",
            traposId=cut(key[1]),
            account=cut(key[0]),
            bound=self._max_conversations,
        )

    def _directory(self, key: tuple[str, str]) -> str:
        """The computer's ask directory, made or checked (``private_directory``)."""
        name = _directory_name(*key)
        try:
            with private_directory(self.root, name):
                pass
        except (Unsafe, OSError) as error:
            raise self._unsafe(os.path.join(self.root, name), error) from None
        return os.path.join(self.root, name)

    def _unsafe(self, path: str, error: Exception) -> GatewayError:
        reason = str(error) if isinstance(error, Unsafe) else error.strerror or str(error)
        log.error("the ask directory {path} is not usable: {reason}", path=path, reason=reason)
        return opencode_error(
            f"the gateway's ask directory for this computer is not usable ({cut(reason)}); "
            "the operator must remove or fix it"
        )

    async def _scope(self, key: tuple[str, str], directory: str) -> None:
        """Give ``directory``'s opencode instance a ``trapsandbox`` MCP block for this computer."""
        if key in self._scoped:
            return
        config = await self._client.config()
        servers = config.get("mcp") if isinstance(config, dict) else None
        server = servers.get(MCP_NAME) if isinstance(servers, dict) else None
        if not isinstance(server, dict) or not isinstance(server.get("url"), str):
            log.warn(
                "opencode has no {name!r} MCP server configured: asks get no tools "
                "(trapsandbox-ctl opencode-config prints the block)",
                name=MCP_NAME,
            )
            self._scoped.add(key)
            return
        headers = server.get("headers") if isinstance(server.get("headers"), dict) else {}
        headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        headers["Authorization"] = f"Bearer {self._token(key)}"
        scoped = {
            "type": "remote",
            "url": server["url"],
            "oauth": False,
            "headers": headers,
            # Not the operator's: opencode cuts a tool call at it (limits.ASK_MCP_TIMEOUT_MS).
            "timeout": limits.ASK_MCP_TIMEOUT_MS,
        }
        name = os.path.basename(directory)
        try:
            with private_directory(self.root, name) as fd:
                write_private(fd, "opencode.json", orjson.dumps({"mcp": {MCP_NAME: scoped}}))
        except (Unsafe, OSError) as error:
            raise self._unsafe(os.path.join(directory, "opencode.json"), error) from None
        await self._client.add_mcp(directory, MCP_NAME, scoped)
        self._scoped.add(key)

    # -- ask ---------------------------------------------------------------------------

    async def ask(
        self,
        account_id: str,
        trapos_id: str,
        capabilities: frozenset[str],
        message_id: str,
        payload: dict[str, Any],
        emit: Emit,
    ) -> dict[str, Any]:
        prompt = payload.get("prompt")
        if type(prompt) is not str or not prompt.strip():
            raise GatewayError(wire.BAD_REQUEST, "prompt must be a non-empty string")
        if len(prompt) > limits.MAX_PROMPT_CHARS:
            raise GatewayError(
                wire.TOO_LARGE, f"the prompt is over {limits.MAX_PROMPT_CHARS} characters"
            )
        new, yes = payload.get("new", False), payload.get("yes", False)
        if type(new) is not bool or type(yes) is not bool:
            raise GatewayError(wire.BAD_REQUEST, "new and yes must be true or false")
        if not self._client.url:
            raise opencode_error("OPENCODE_URL is not set on the gateway")
        key = (account_id, trapos_id)
        if key in self.runs:
            raise GatewayError(
                wire.OVERLOADED, "an ask is already running on this computer: wait or cancel it"
            )
        done: Deferred = Deferred()
        placeholder = Run(key, message_id, Conversation("", "", yes), emit, done)
        self.runs[key] = placeholder  # claims the computer while the session is set up
        try:
            await self.stream.ready().addTimeout(limits.ASK_STREAM_READY_TIMEOUT, self._clock)
            conversation = await self._conversation(key, new, yes)
            run = placeholder
            run.conversation = conversation
            run.unsubscribe = self.stream.subscribe(
                conversation.session_id, lambda event: self._event(run, event)
            )
            run.bound = self._clock.callLater(self._timeout, self._timed_out, run)
            await self._client.prompt_async(
                conversation.directory,
                conversation.session_id,
                prompt,
                system_note(trapos_id, capabilities),
            )
        except BaseException as error:
            failure = Failure()
            self._finish(placeholder, None, "opencode_error")
            if failure.check(GatewayError):
                raise
            from twisted.internet.defer import TimeoutError

            if failure.check(TimeoutError):
                raise opencode_error(
                    f"opencode at {self._client.where}: its event stream did not open"
                ) from None
            raise error
        return await done

    async def _conversation(self, key: tuple[str, str], new: bool, yes: bool) -> Conversation:
        self._remember(key)
        conversation = self.conversations.get(key)
        if conversation is not None and not new and conversation.yes == yes:
            return conversation
        directory = self._directory(key)
        await self._scope(key, directory)
        rules = session_rules(yes)
        session = await self._client.create_session(directory, key[1], rules)
        if not isinstance(session, dict) or type(session.get("id")) is not str:
            raise opencode_error("opencode answered POST /session without a session id")
        conversation = Conversation(session["id"], directory, yes)
        self.conversations[key] = conversation
        log.info(
            "{traposId} talks to opencode session {session}",
            traposId=cut(key[1]),
            session=cut(conversation.session_id),
        )
        return conversation

    # -- Events ------------------------------------------------------------------------

    def _event(self, run: Run, event: dict[str, Any]) -> None:
        if run.finished:
            return
        kind = event.get("type")
        props = event.get("properties") or {}
        if kind == "message.updated":
            info = props.get("info") if type(props.get("info")) is dict else {}
            if type(info.get("id")) is str and type(info.get("role")) is str:
                run.roles[info["id"]] = info["role"]
                tokens = info.get("tokens")
                if info["role"] == "assistant" and type(tokens) is dict:
                    run.tokens[info["id"]] = (
                        _count(tokens.get("input")),
                        _count(tokens.get("output")),
                    )
        elif kind == "message.part.delta":
            if props.get("field", "text") == "text" and type(props.get("delta")) is str:
                part = props.get("partID")
                if run.roles.get(props.get("messageID")) == "user":
                    return
                if type(part) is str:
                    run.started = True
                    run.texts[part] = run.texts.get(part, "") + props["delta"]
                    self._text(run)
        elif kind == "message.part.updated":
            part = props.get("part") if type(props.get("part")) is dict else {}
            if part.get("type") == "text":
                self._text_part(run, part)
            elif part.get("type") == "tool":
                self._tool_part(run, part)
        elif kind == "permission.asked":
            self._permission(run, props)
        elif kind == "session.error":
            error = props.get("error")
            run.error = error if type(error) is dict else {"name": "UnknownError"}
        elif kind == "session.status":
            status = props.get("status") if type(props.get("status")) is dict else {}
            if status.get("type") == "busy":
                run.started = True
            elif status.get("type") == "idle" and (run.started or run.error):
                self._idle(run)
        elif kind == "session.idle":
            if run.started or run.error:
                self._idle(run)

    def _text_part(self, run: Run, part: dict[str, Any]) -> None:
        part_id, text = part.get("id"), part.get("text")
        if type(part_id) is not str or type(text) is not str:
            return
        if run.roles.get(part.get("messageID")) != "assistant" or part.get("synthetic"):
            return
        run.started = True
        if len(text) >= len(run.texts.get(part_id, "")):
            run.texts[part_id] = text
            self._text(run)

    def _tool_part(self, run: Run, part: dict[str, Any]) -> None:
        call = part.get("callID")
        name = part.get("tool")
        state = part.get("state") if type(part.get("state")) is dict else {}
        status = state.get("status")
        if type(call) is not str or type(name) is not str or type(status) is not str:
            return
        run.started = True
        known = run.tools.setdefault(call, {"name": name, "input": None})
        if type(state.get("input")) is dict and state["input"]:
            known["input"] = state["input"]
            if run.pending:
                self._release_call(run, call)
        if status == "pending" or run.tool_status.get(call) == status:
            return
        run.tool_status[call] = status
        message: dict[str, Any] = {"type": "tool", "name": name, "status": status}
        if status == "error" and type(state.get("error")) is str:
            message["error"] = state["error"][: limits.PERMISSION_DETAIL_CHARS]
        self._send(run, message)

    def _permission(self, run: Run, props: dict[str, Any]) -> None:
        """
        A permission request reaches the player with what the tool would do.

        opencode often asks before the gateway has heard the tool part's input
        (``message.part.updated`` running), so the request may wait for it: it
        goes out as soon as the input arrives, is fetched from opencode
        (``GET /session/S/message/M``), or after ``ASK_PERMISSION_DETAIL_WAIT``
        with the permission's patterns.
        """
        permission_id = props.get("id")
        if type(permission_id) is not str or permission_id in run.pending:
            return
        run.permissions.add(permission_id)
        self._by_permission[permission_id] = run
        tool = props.get("tool") if type(props.get("tool")) is dict else {}
        call, message_id = tool.get("callID"), tool.get("messageID")
        known = run.tools.get(call) if type(call) is str else None
        if known is not None and known.get("input") is not None:
            self._ask_player(run, props)
            return
        if type(call) is not str:
            self._ask_player(run, props)
            return
        timer = self._clock.callLater(
            limits.ASK_PERMISSION_DETAIL_WAIT, self._release_permission, run, permission_id
        )
        run.pending[permission_id] = (props, timer)
        if type(message_id) is str:
            conversation = run.conversation
            d = self._client.message(conversation.directory, conversation.session_id, message_id)
            d.addCallback(self._fetched_message, run, call)
            d.addErrback(_logged("fetching a tool's input"))

    def _fetched_message(self, message: Any, run: Run, call: str) -> None:
        parts = message.get("parts") if isinstance(message, dict) else None
        for part in parts if isinstance(parts, list) else []:
            if isinstance(part, dict) and part.get("callID") == call and part.get("type") == "tool":
                state = part.get("state") if type(part.get("state")) is dict else {}
                if type(state.get("input")) is dict and state["input"]:
                    known = run.tools.setdefault(call, {"name": part.get("tool"), "input": None})
                    known["input"] = state["input"]
                    self._release_call(run, call)

    def _release_call(self, run: Run, call: str) -> None:
        for permission_id, (props, _) in list(run.pending.items()):
            tool = props.get("tool") if type(props.get("tool")) is dict else {}
            if tool.get("callID") == call:
                self._release_permission(run, permission_id)

    def _release_permission(self, run: Run, permission_id: str) -> None:
        waiting = run.pending.pop(permission_id, None)
        if waiting is None:
            return
        props, timer = waiting
        if timer.active():
            timer.cancel()
        if permission_id in run.permissions:  # not answered (or ended) meanwhile
            self._ask_player(run, props)

    def _ask_player(self, run: Run, props: dict[str, Any]) -> None:
        tool = props.get("permission") if type(props.get("permission")) is str else "?"
        call = props.get("tool", {}).get("callID") if type(props.get("tool")) is dict else None
        known = run.tools.get(call) if type(call) is str else None
        if known is not None and known.get("input") is not None:
            detail = detail_of(tool, known["input"])
        else:
            patterns = props.get("patterns")
            detail = ", ".join(map(str, patterns)) if isinstance(patterns, list) else ""
        self._send(run, {"type": "permission", "id": props["id"], "tool": tool, "detail": detail})

    # -- Sending -------------------------------------------------------------------------

    def _text(self, run: Run) -> None:
        pending = sum(len(t) - run.sent.get(p, 0) for p, t in run.texts.items())
        if pending >= limits.ASK_PARTIAL_MAX_CHARS:
            self._flush(run)
        elif pending and run.flush_timer is None:
            run.flush_timer = self._clock.callLater(
                limits.ASK_PARTIAL_INTERVAL, self._flush_timer, run
            )

    def _flush_timer(self, run: Run) -> None:
        run.flush_timer = None
        self._flush(run)

    def _flush(self, run: Run) -> None:
        if run.flush_timer is not None and run.flush_timer.active():
            run.flush_timer.cancel()
        run.flush_timer = None
        pieces = []
        for part, text in run.texts.items():
            sent = run.sent.get(part, 0)
            if len(text) > sent:
                if sent == 0 and pieces == [] and any(run.sent.values()):
                    pieces.append("\n\n")  # a new text part starts a new paragraph
                pieces.append(text[sent:])
                run.sent[part] = len(text)
        text = "".join(pieces)
        while text:
            chunk, text = (
                text[: limits.ASK_PARTIAL_MAX_CHARS],
                text[limits.ASK_PARTIAL_MAX_CHARS :],
            )
            self._emit(run, {"type": "text_delta", "text": chunk})

    def _send(self, run: Run, message: dict[str, Any]) -> None:
        self._flush(run)
        self._emit(run, message)

    def _emit(self, run: Run, message: dict[str, Any]) -> None:
        if run.finished:
            return
        try:
            run.emit(message)
        except GatewayError:
            # The computer is gone: nobody is reading this answer any more.
            log.info("{traposId} left during an ask: aborting it", traposId=cut(run.key[1]))
            self._abort(run)
            self._finish(run, GatewayError(wire.NOT_CONNECTED, "the computer left"), "disconnected")

    # -- Ending ----------------------------------------------------------------------------

    def _idle(self, run: Run) -> None:
        self._flush(run)
        error = run.error
        if error is not None and (run.aborted or error.get("name") == "MessageAbortedError"):
            self._finish(
                run, GatewayError(wire.CANCELLED, "cancelled: the agent was stopped"), "cancelled"
            )
            return
        if error is not None:
            self._finish(run, opencode_error(_run_error(error)), "run_failed")
            return
        text = "".join(run.texts.values())
        self._finish(run, {"sessionId": run.conversation.session_id, "text": text}, "ok")

    def _finish(self, run: Run, result: Any, outcome: str | None = None) -> None:
        if run.finished:
            return
        run.finished = True
        if self.runs.get(run.key) is run:
            del self.runs[run.key]
        for permission in run.permissions:
            self._by_permission.pop(permission, None)
        for _, waiting in run.pending.values():
            if waiting.active():
                waiting.cancel()
        run.pending.clear()
        for timer in (run.flush_timer, run.bound):
            if timer is not None and timer.active():
                timer.cancel()
        if run.unsubscribe is not None:
            run.unsubscribe()
        if outcome is not None:
            self._metrics.ask(outcome)
            used_in = sum(t[0] for t in run.tokens.values())
            used_out = sum(t[1] for t in run.tokens.values())
            self._metrics.ask_tokens(used_in, used_out)
        if result is None:
            return
        if isinstance(result, Exception):
            run.done.errback(result)
        else:
            run.done.callback(result)

    def _timed_out(self, run: Run) -> None:
        run.bound = None
        log.info(
            "an ask on {traposId} ran past {timeout:g} s: aborting",
            traposId=cut(run.key[1]),
            timeout=self._timeout,
        )
        self._abort(run)
        self._finish(
            run,
            GatewayError(
                wire.TIMEOUT, f"the agent did not finish within {self._timeout / 60:g} minutes"
            ),
            "timeout",
        )

    def _abort(self, run: Run) -> Deferred:
        run.aborted = True
        conversation = run.conversation
        d = self._client.abort(conversation.directory, conversation.session_id)
        d.addErrback(_logged("abort"))
        return d

    def _reconnected(self) -> None:
        """Events were lost while the stream was down: end the asks whose session is idle."""
        for run in list(self.runs.values()):
            if run.finished or not run.conversation.session_id:
                continue
            d = self._client.statuses(run.conversation.directory)
            d.addCallback(self._check_status, run)
            d.addErrback(_logged("status check"))

    def _check_status(self, statuses: Any, run: Run) -> None:
        status = statuses.get(run.conversation.session_id) if isinstance(statuses, dict) else None
        busy = isinstance(status, dict) and status.get("type") in ("busy", "retry")
        if not busy and not run.finished:
            run.started = True
            self._idle(run)

    # -- cancel and ask_permission ---------------------------------------------------------

    def cancel(self, account_id: str, trapos_id: str, message_id: Any) -> Deferred | None:
        """Abort the computer's ask ``message_id``; None if it has none such running."""
        run = self.runs.get((account_id, trapos_id))
        if run is None or run.message_id != message_id or run.finished:
            return None
        if not run.conversation.session_id:
            # Still setting up: end it now; the prompt never goes out... or is aborted at once.
            return None
        grace = self._clock.callLater(limits.ASK_ABORT_GRACE, self._abort_unheard, run)
        run.done.addBoth(lambda result: (grace.active() and grace.cancel(), result)[1])
        return self._abort(run)

    def _abort_unheard(self, run: Run) -> None:
        self._finish(
            run, GatewayError(wire.CANCELLED, "cancelled: the agent was stopped"), "cancelled"
        )

    def reply(self, account_id: str, trapos_id: str, permission_id: Any, response: Any) -> Deferred:
        if response not in PERMISSION_REPLIES:
            raise GatewayError(wire.BAD_REQUEST, "response must be once, always or reject")
        run = self._by_permission.get(permission_id) if type(permission_id) is str else None
        if run is None or run.key != (account_id, trapos_id):
            raise GatewayError(
                wire.BAD_REQUEST, "no permission request of this computer's ask has that id"
            )
        run.permissions.discard(permission_id)
        del self._by_permission[permission_id]
        return self._client.reply_permission(run.conversation.directory, permission_id, response)

    def stop(self) -> None:
        self.stream.stop()
        for run in list(self.runs.values()):
            self._finish(run, GatewayError(wire.NOT_CONNECTED, "the gateway is shutting down"))


def _logged(what: str) -> Callable[[Failure], None]:
    """An errback for a call whose failure only needs a log line."""
    return lambda failure: log.info(
        "{what} failed: {why}", what=what, why=cut(failure.getErrorMessage())
    )


def _count(value: Any) -> int:
    return value if type(value) is int and value >= 0 else 0


def _run_error(error: dict[str, Any]) -> str:
    name = error.get("name") if type(error.get("name")) is str else "UnknownError"
    data = error.get("data") if type(error.get("data")) is dict else {}
    message = data.get("message") if type(data.get("message")) is str else ""
    if name in ("ProviderModelNotFoundError", "ModelNotFoundError") or "model" in message.lower():
        hint = " (is a model configured in opencode?)"
    elif name == "ProviderAuthError":
        hint = " (the model provider refused opencode's key)"
    else:
        hint = ""
    return f"the agent's run failed: {cut(name)}{': ' + cut(message) if message else ''}{hint}"
