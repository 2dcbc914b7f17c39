"""
``trapsandbox-ctl batch``: many requests over one operator WebSocket (``GET /operator``).

The requests are NDJSON, one ``{"traposId", "type", "payload"?, "timeoutMs"?,
"account"?, "id"?}`` a line (a line without ``id`` is known by its line
number, from 1); at most ``concurrency`` are in flight, and each answer is
printed as one JSON line as it arrives (``{"id", "status", "ok", ...}``, the
id being the line's).  A line that is not a JSON object is answered here,
400, without being sent.

The rest of ``trapsandbox-ctl`` is synchronous urllib; this one command runs
the Twisted reactor with an Autobahn client, imported only when it runs, so
the others start as fast as before.  On the wire each request carries an id
of ours (its index), so ids repeated in the input cannot mix up two answers.
"""

from __future__ import annotations

import sys
import urllib.parse
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

import orjson

from trapsandbox import limits


class BatchFailed(Exception):
    """The connection failed or was refused: one line, exit status 2."""


Line = tuple[Any, dict[str, Any] | None, str | None]


def read_lines(data: Iterable[bytes], account: str | None = None) -> list[Line]:
    """``(shown id, request or None, why not)`` for each non-blank line."""
    lines: list[Line] = []
    for number, raw in enumerate(data, 1):
        if not raw.strip():
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as error:
            lines.append((number, None, f"line {number} is not JSON: {error}"))
            continue
        if type(obj) is not dict:
            lines.append((number, None, f"line {number} is not a JSON object"))
            continue
        if account is not None:
            obj.setdefault("account", account)
        lines.append((obj.get("id", number), obj, None))
    return lines


def operator_url(base: str) -> str:
    """``http(s)://host:port[/prefix]`` -> ``ws(s)://host:port[/prefix]/operator``."""
    parts = urllib.parse.urlsplit(base)
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.hostname:
        raise BatchFailed(f"--url {base!r} is not an http:// or https:// URL")
    return urllib.parse.urlunsplit(
        (scheme, parts.netloc, parts.path.rstrip("/") + "/operator", "", "")
    )


def _local_answer(shown: Any, message: str) -> dict[str, Any]:
    return {
        "id": shown,
        "status": 400,
        "ok": False,
        "error": {"code": "bad_request", "message": message},
    }


class Batch:
    """The lines, what is in flight, and what was printed."""

    def __init__(self, lines: list[Line], concurrency: int, out: BinaryIO) -> None:
        self._lines: Iterator[tuple[int, Line]] = iter(enumerate(lines))
        self._concurrency = concurrency
        self._out = out
        self._shown: dict[int, Any] = {}
        self._exhausted = False
        self.protocol: Any = None
        self.all_ok = True
        self.result: int | None = None
        self.finished: Any = None  # a Deferred, set by run

    def opened(self, protocol: Any) -> None:
        self.protocol = protocol
        self._fill()

    def _fill(self) -> None:
        while len(self._shown) < self._concurrency and not self._exhausted:
            entry = next(self._lines, None)
            if entry is None:
                self._exhausted = True
                break
            index, (shown, obj, why) = entry
            if obj is None:
                self._print(_local_answer(shown, why or "unreadable"))
                continue
            self._shown[index] = shown
            self.protocol.sendMessage(orjson.dumps({**obj, "id": index}))
        if self._exhausted and not self._shown and self.result is None:
            # Done: the exit status is given once the close handshake ends (onClose).
            self.result = 0 if self.all_ok else 1
            self.protocol.sendClose(1000)

    def answered(self, answer: Any) -> None:
        index = answer.get("id") if isinstance(answer, dict) else None
        if type(index) is int and index in self._shown:
            answer["id"] = self._shown.pop(index)
        self._print(answer)
        self._fill()

    def _print(self, answer: Any) -> None:
        if not isinstance(answer, dict) or answer.get("status") != 200:
            self.all_ok = False
        self._out.write(orjson.dumps(answer) + b"\n")
        self._out.flush()

    def closed(self, code: int | None, reason: str | None, refusal: str | None) -> None:
        if self.result is not None:
            self.finished.callback(self.result)
            return
        if self.protocol is None:
            self.finished.errback(BatchFailed(refusal or f"the connection failed: {reason}"))
            return
        self.finished.errback(
            BatchFailed(
                f"the gateway closed the connection ({code} {reason or ''}) with "
                f"{len(self._shown)} requests unanswered"
            )
        )


def _client(batch: Batch, url: str, token: str | None) -> Any:
    from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol

    class Client(WebSocketClientProtocol):
        def onOpen(self) -> None:
            batch.opened(self)

        def onMessage(self, payload: bytes, isBinary: bool) -> None:
            try:
                answer = orjson.loads(payload)
            except orjson.JSONDecodeError:
                answer = {"id": None, "status": None, "unreadable": repr(payload[:200])}
            batch.answered(answer)

        def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
            refusal = None
            line = getattr(self, "http_status_line", None)
            if batch.protocol is None and line:
                # The upgrade was answered with an HTTP error: "HTTP/1.1 401 wrong bearer token".
                status = line.split(" ", 1)[1] if " " in line else line
                refusal = f"the gateway at {url} refused the operator socket: {status}"
                if status.startswith("401") and not token:
                    refusal += " (give --token or set SANDBOX_ADMIN_TOKEN)"
            batch.closed(code, reason, refusal)

    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    factory = WebSocketClientFactory(url, headers=headers)
    factory.protocol = Client
    factory.setProtocolOptions(
        openHandshakeTimeout=limits.OPEN_HANDSHAKE_TIMEOUT,
        closeHandshakeTimeout=limits.CLOSE_HANDSHAKE_TIMEOUT,
        autoPingInterval=limits.AUTO_PING_INTERVAL,
        autoPingTimeout=limits.AUTO_PING_TIMEOUT,
    )
    return factory


async def _run(reactor: Any, batch: Batch, base: str, token: str | None) -> int:
    from twisted.internet import endpoints, ssl
    from twisted.internet.defer import Deferred

    url = operator_url(base)
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "wss" else 80)
    endpoint: Any = endpoints.HostnameEndpoint(
        reactor, parts.hostname, port, timeout=limits.OPEN_HANDSHAKE_TIMEOUT
    )
    if parts.scheme == "wss":
        endpoint = endpoints.wrapClientTLS(ssl.optionsForClientTLS(parts.hostname), endpoint)
    batch.finished = Deferred()
    try:
        await endpoint.connect(_client(batch, url, token))
    except Exception as error:
        raise BatchFailed(f"cannot reach the gateway at {base}: {error}") from None
    return await batch.finished


def run(lines: list[Line], base: str, token: str | None, concurrency: int) -> int:
    """Send ``lines``; 0 if every answer is a 200, 1 if not, 2 (with a line) if the link failed."""
    from twisted.internet import reactor
    from twisted.internet.defer import Deferred
    from twisted.python.failure import Failure

    batch = Batch(lines, concurrency, sys.stdout.buffer)
    outcome: list[Any] = []

    def start() -> None:
        d = Deferred.fromCoroutine(_run(reactor, batch, base, token))
        d.addBoth(outcome.append)
        d.addBoth(lambda _: reactor.stop())

    reactor.callWhenRunning(start)
    reactor.run()
    if not outcome:
        return 130  # interrupted
    result = outcome[0]
    if isinstance(result, Failure):
        if result.check(BatchFailed):
            print(f"trapsandbox-ctl: {result.value}", file=sys.stderr)
            return 2
        result.raiseException()
    return result
