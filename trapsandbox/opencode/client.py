"""
opencode's HTTP API as far as ``sandbox ask`` needs it (SPEC §11): sessions,
prompts, aborts, permission replies, question answers, MCP servers, statuses.  Every call is
bounded (``ASK_CALL_TIMEOUT``), sends opencode's Basic auth, follows no
redirect, and fails with an ``opencode_error`` a player can act on
(``explain``), never with a library's exception.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import orjson
import treq
from hyperlink import DecodedURL
from twisted.internet.defer import Deferred, TimeoutError, succeed
from twisted.internet.error import ConnectError, ConnectionRefusedError, DNSLookupError
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure
from twisted.web.client import HTTPConnectionPool, ResponseFailed, _HTTP11ClientFactory

from trapsandbox import errors, limits
from trapsandbox.computers.wire import cut
from trapsandbox.errors import GatewayError
from trapsandbox.opencode.probe import redact


def opencode_error(message: str) -> GatewayError:
    """An ``opencode_error``: opencode, or the gateway's side of talking to it, failed."""
    return GatewayError(errors.OPENCODE_ERROR, message)


def unauthorized(where: str) -> GatewayError:
    """opencode refused the gateway's credentials (a 401): which settings to check."""
    return opencode_error(
        f"opencode at {where} answered 401 Unauthorized: check "
        "OPENCODE_SERVER_PASSWORD and OPENCODE_SERVER_USERNAME"
    )


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
    elif failure.check(TimeoutError):
        reason = "no answer in time"
    else:
        reason = cut(failure.getErrorMessage() or failure.type.__name__)
    return opencode_error(f"opencode at {where}: {reason}")


class _QuietFactory(_HTTP11ClientFactory):
    noisy = False


class OpencodePool(HTTPConnectionPool):
    """
    The gateway's connections to opencode, kept open between calls until the gateway stops.
    Once closed it keeps nothing: a call answered after the stop (opencode runs on; a call
    started by another's answer) has its connection closed, not cached for 240 s.
    """

    closed = False
    # Each new connection to opencode no longer logs "Starting factory" and "Stopping factory"
    # (Twisted's Factory.noisy): two lines per connection, most of the gateway's log under asks.
    _factory = _QuietFactory

    def closeCachedConnections(self) -> Deferred:
        self.closed = True
        return super().closeCachedConnections()

    def _putConnection(self, key: Any, connection: Any) -> None:
        if self.closed:
            connection.transport.loseConnection()
        else:
            super()._putConnection(key, connection)


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
        # The URL as sent: ASCII, its host through IDNA (once, not per call).
        self._base = DecodedURL.from_text(self.url).to_uri().to_text() if self.url else ""
        self.where = redact(self.url)
        self.auth = (username, password) if password else None
        self._timeout = timeout
        self._in_flight = 0
        self._settling: list[Deferred] = []

    def target(self, path: str, directory: str | None = None) -> str:
        """The URL of ``path`` (its ids %-encoded by ``_id``), for ``directory``'s instance
        if given."""
        url = self._base + path
        return url + "?directory=" + quote(directory, safe="/") if directory else url

    def call(
        self, method: str, path: str, body: Any = None, directory: str | None = None
    ) -> Deferred:
        """Fires with the decoded JSON answer (None for an empty one) or an ``opencode_error``."""
        kwargs: dict[str, Any] = {"auth": self.auth}
        if body is not None:
            kwargs["data"] = orjson.dumps(body)
            kwargs["headers"] = {b"Content-Type": [b"application/json"]}
        d = self.http.request(method, self.target(path, directory), **kwargs)
        d.addCallback(self._read, method, path)
        d.addTimeout(self._timeout, self._clock)
        d.addErrback(lambda failure: _fail(explain(failure, self.where)))
        self._in_flight += 1
        d.addBoth(self._landed)
        return d

    def _landed(self, result: Any) -> Any:
        self._in_flight -= 1
        if not self._in_flight:
            settling, self._settling = self._settling, []
            for waiter in settling:
                waiter.callback(None)
        return result

    def settled(self) -> Deferred:
        """Fires once no call is in flight (each is bounded): the gateway stops after that."""
        if not self._in_flight:
            return succeed(None)
        waiter = Deferred()
        self._settling.append(waiter)
        return waiter

    def _read(self, response, method: str, path: str) -> Deferred:
        d = treq.content(response)
        d.addCallback(self._judge, response, method, path)
        return d

    def _judge(self, body: bytes, response, method: str, path: str) -> Any:
        code = response.code
        if code == 401:
            raise unauthorized(self.where)
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
        return self.call("POST", f"/session/{_id(session_id)}/prompt_async", body, directory)

    def abort(self, directory: str, session_id: str) -> Deferred:
        return self.call("POST", f"/session/{_id(session_id)}/abort", None, directory)

    def reply_permission(self, directory: str, permission_id: str, reply: str) -> Deferred:
        return self.call(
            "POST", f"/permission/{_id(permission_id)}/reply", {"reply": reply}, directory
        )

    def reply_question(
        self, directory: str, question_id: str, answers: list[list[str]]
    ) -> Deferred:
        """``answers``: the labels (or typed text) picked, one list per question."""
        return self.call(
            "POST", f"/question/{_id(question_id)}/reply", {"answers": answers}, directory
        )

    def reject_question(self, directory: str, question_id: str) -> Deferred:
        return self.call("POST", f"/question/{_id(question_id)}/reject", None, directory)

    def message(self, directory: str, session_id: str, message_id: str) -> Deferred:
        """``{info, parts}`` of one message of a session."""
        return self.call(
            "GET", f"/session/{_id(session_id)}/message/{_id(message_id)}", None, directory
        )

    def dispose(self, directory: str) -> Deferred:
        """Give ``directory``'s instance back (``instances``): opencode re-creates it on demand."""
        return self.call("POST", "/instance/dispose", None, directory)

    def statuses(self, directory: str) -> Deferred:
        """``{sessionID: {type: busy|idle|retry}}`` of the busy sessions."""
        return self.call("GET", "/session/status", None, directory)


def _id(value: str) -> str:
    """An id opencode gave, as one path segment: it cannot name another path or a query."""
    return quote(value, safe="")


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
