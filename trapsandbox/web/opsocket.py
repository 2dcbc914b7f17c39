"""
The operator WebSocket, ``GET /operator``: many requests to computers over one
connection, each correlated by an id of the operator's choosing.

    operator                                          gateway
    (upgrade: Authorization: Bearer <token>, as on the HTTP routes;
     refused with the HTTP route's status: 401, 403 or 429)
    {"id": 7, "traposId": "7:base", "type": "ping",   ->
     "payload"?: {...}, "timeoutMs"?: n, "account"?: "NAME"}
                                                      <- {"id": 7, "status": 200, "ok": true,
                                                          "payload": {...}}
    {"id": "b", "traposId": "9:", "type": "ping"}     ->
                                                      <- {"id": "b", "status": 404, "ok": false,
                                                          "error": {"code", "message"}}

A page of the console (SPEC §14: a browser's upgrade carrying the
gateway's own ``Origin`` and no ``Authorization``) gives its token as its
first message instead, never in a URL:

    {"token": "..."}                                  ->
                                                      <- {"authenticated": true, "account": a|null}
    (a wrong or missing token: closed 4001 with the reason, counted by the
     same throttle as a wrong header; none within REQUEST_DEADLINE: 4001)

An empty token keeps what the upgrade decided (loopback with no admin token
is the admin, the browser rule applied as for the header); a socket such an
upgrade could not admit waits for the token and answers nothing else.

A ``screen_watch`` (SPEC §14) streams: each frame the computer sends is
relayed as it comes, before the final answer, as a message of its own

                                                      <- {"id": 7, "status": 200, "partial": true,
                                                          "payload": {"type": "screen", width,
                                                          height, cursorX, cursorY, cursorBlink,
                                                          rows: {"<y>": {line, text, background}},
                                                          palette?}}

(full-width rows, ``trapsandbox.computers.screen``), at most ``maxFps`` a
second whatever the computer sends, and none expanded while this connection
has no room for it (``ScreenGate``: merged until it has); it runs until the
computer ends it, a frame claims a screen too large to relay (413
``too_large``) or this connection closes (``timeoutMs`` bounds it, by
default ``SCREEN_WATCH_TIMEOUT``).  ``{"id", "type": "watch_computers",
"account"?}`` (no ``traposId``) is the gateway's own: a partial ``{"computers":
[...]}`` (``GET /computers``' entries this operator sees; in cluster mode every
process's, ``OperatorRequests.visible``) at once and after each connect,
disconnect or change of capabilities (a burst of them listed once,
``web.listings``), until the connection closes; one per connection (another
is answered 429 ``too_many_watches``).  So is
``{"id", "type": "watch_activity", "traposId", "account"?}``: a partial
``{"activity": {n, type, detail, by, account?, state, durationMs?}}`` as each
request to that computer (anyone's: an operator's, the agent's, its player's
``ask``; ``by`` and ``account`` as ``trapsandbox.computers.callers`` says)
starts (``state`` "started") and ends (its outcome); an ask also as it runs
(``state`` "running" with ``text``, the agent's next words, or
``tool``/``status``, ``permission``/``detail``, ``question``); in cluster mode
it ends (404) when the computer leaves the process holding it
(``OperatorRequests.watch_activity``). Every other type has
its one answer only.  The snapshot types (SPEC §15: ``snapshots``,
``snapshot_take``, ``snapshot_changes`` and ``snapshot_restore`` with
``payload: {"snapshot": id}``) are the gateway's own too, answered with
``payload`` holding what their HTTP routes answer (``web.snapshotcalls``).

The agent (issue 34, ``web.agentcalls``): an ``ask`` is the computer's own
conversation (the one ``sandbox ask`` continues there: its account and
traposId, what it allows), one at a time per computer whoever started it,
shown in its activity as sent by this operator.  Its partials come as the
computer's ``ask`` gets them:

    {"id": "a", "traposId", "type": "ask",        ->
     "payload": {"prompt", "new"?, "yes"?}}
                                                      <- {"id": "a", "status": 200, "partial": true,
                                                          "payload": {"type": "text_delta", text}
                                                          | {"type": "tool", name, status,
                                                             detail?, error?}
                                                          | {"type": "permission", id, tool,
                                                             detail}
                                                          | {"type": "question", id, questions}
                                                          | {"type": "waiting", ahead}}
    {"id": 2, "traposId", "type": "ask_permission",
     "payload": {"permissionId", "response": "once"|"always"|"reject"}}  -> {} (200)
    {"id": 3, "traposId", "type": "ask_answer",
     "payload": {"questionId", "answers": [[label, ..], ..] | "reject": true}}  -> {}
    {"id": 4, "traposId", "type": "ask_cancel", "payload": {"ask": "a"}}
                                                      <- {"id": 4, ..., "payload": {"cancelled":
                                                          bool}}  (only this socket's asks)
                                                      <- {"id": "a", "status": 200, "ok": true,
                                                          "payload": {sessionId, text, changed?,
                                                          snapshot?}}
                                                         (``snapshot``: taken before the run's
                                                          first change; ``snapshot_restore``
                                                          undoes it) or its error: 503
                                                          ``overloaded`` while another ask runs
                                                          there, ``cancelled``, ``stopped``, ...

Closing the socket stops its asks.  A change to a computer's files from the
console is one request, made by the gateway in as many as it takes, quietly,
and one entry of the activity (``web.filecalls``): ``file_write {path,
content}`` (base64, up to ``MAX_FILE_BYTES``; a partial ``{written, size}``
after each part the computer wrote), ``file_move {from, to}`` (a file or a
folder) and ``folder_make {path}``.

An answer's ``status`` and the rest of it are what ``POST
/computers/{traposId}/requests`` (``?account=`` being ``account``) would
answer: ``trapsandbox.web.operator`` decides both, for both.  Answers go out as
they complete, in any order.  A message that cannot be read (not JSON, not an
object, no usable ``id``: a string of 1 to 128 characters or an integer, no
``traposId``) is answered 400 with the id it had, or ``"id": null``; so is a
binary frame, and an id already in flight on this connection.  The
connection stays open after each of them.  Past ``MAX_OPERATOR_IN_FLIGHT``
requests in flight a request is answered 503 ``overloaded`` at once; a
message over ``MAX_BODY_BYTES`` is closed with 1009 (by Autobahn).  Closing
the connection cancels every request in flight (runs on computers are
cancelled as when an HTTP caller goes away).  One account's token may hold at
most ``max_per_account`` sockets open at once (the admin is not bounded here);
past it the upgrade is refused 429.

What the gateway sends goes through an ``Outbound``, as a computer's
connection does: an operator that stops reading has its new requests
refused once an answer finds no room, and is closed with 4004 once it has
been stalled for the stall timeout.
"""

from __future__ import annotations

import itertools
from typing import Any

import orjson
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.protocol import WebSocketProtocol
from autobahn.websocket.types import ConnectionDeny
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox import errors, limits
from trapsandbox.admission import auth, proxies
from trapsandbox.admission.tally import Tally
from trapsandbox.compat import fixes
from trapsandbox.computers import wire
from trapsandbox.computers.callers import Caller
from trapsandbox.computers.outbound import Outbound
from trapsandbox.computers.protocol import server_options
from trapsandbox.computers.sending import Sending
from trapsandbox.errors import GatewayError
from trapsandbox.ops.metrics import Metrics
from trapsandbox.web.listings import Listing
from trapsandbox.web.operator import INTERNAL, Answer, OperatorRequests, error_answer, rejected
from trapsandbox.web.validation import json_object, short_string

log = Logger()

_SHAPE = '{"id", "traposId", "type", "payload"?, "timeoutMs"?, "account"?}'
# Handled here, not sent to a computer: the visible computers, and one computer's requests, live.
WATCH_COMPUTERS = "watch_computers"
WATCH_ACTIVITY = "watch_activity"
CANCELLED = error_answer(503, errors.UNAVAILABLE, "the request was cancelled")
# Each connection's name for the asks it starts (``agentcalls.run_id``).
_serials = itertools.count(1)


def _id_of(obj: dict[str, Any]) -> str | int:
    message_id = obj.get("id")
    kind = type(message_id)
    # Not bool (an int in Python) and not float; orjson reads integers past 64 bits as floats.
    if kind is int or (kind is str and 0 < len(message_id) <= limits.MAX_ID_LENGTH):
        return message_id
    raise errors.bad_request(
        f"id must be a string of 1 to {limits.MAX_ID_LENGTH} characters or an integer"
    )


def read_message(payload: bytes) -> tuple[str | int, dict[str, Any]]:
    """``(id, the message)``; raises ``bad_request`` (answered with no id)."""
    obj = json_object(payload, _SHAPE, "the message")
    return _id_of(obj), obj


def target(obj: dict[str, Any]) -> tuple[str, str | None]:
    """``(traposId, account or None)``; raises ``bad_request`` (answered with the id)."""
    trapos_id = short_string(obj, "traposId", limits.MAX_ID_LENGTH)
    account = obj.get("account")
    if account is not None and type(account) is not str:
        raise errors.bad_request("account must be a string")
    return trapos_id, account


def encode_answer(message_id: str | int | None, answer: Answer) -> bytes:
    """``{"id", "status", ...the answer's body}``, the body encoded once."""
    status, body, _ = answer.encoded()
    # Every body is an object with at least "ok": splice the two fields in front.
    return b'{"id":%b,"status":%d,%b' % (orjson.dumps(message_id), status, body[1:])


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


def _header(request: Any, name: str) -> bytes | None:
    value = request.headers.get(name)
    return None if value is None else value.encode("latin-1", "replace")


def token_message(obj: dict[str, Any]) -> bytes | None:
    """The token of a ``{"token": "..."}`` message as an ``Authorization`` value, or None."""
    if set(obj) != {"token"}:
        return None
    token = obj["token"]
    if type(token) is not str:
        raise errors.bad_request("token must be a string")
    return b"Bearer " + token.encode("utf-8", "replace") if token else b""


class OperatorSocket(Sending, fixes.HeadersOnDeny, WebSocketServerProtocol):
    # (Fast mode serves ``trapsandbox.fast.protocols.FastOperatorSocket``.)
    factory: OperatorSocketFactory

    def __init__(self) -> None:
        super().__init__()
        # onClose runs even for connections that never opened: all state here.
        self.operator: auth.Operator | None = None
        # The account this socket counts against (``factory.per_account``) until it closes.
        self.counted: str | None = None
        self.authorization: bytes | None = None
        self.peer_address = "?"
        self.outbound: Outbound | None = None
        self.in_flight: dict[str | int, Deferred] = {}
        # What its asks are known by (``ask_cancel`` names them by their id on this socket).
        self.connection = f"operator-{next(_serials)}"
        # The id of this socket's ``watch_computers`` (one per socket), while it runs.
        self.watching: str | int | None = None
        # An answer found no room while the transport was paused (``Outbound``).
        self.dropped = False
        # A console page's upgrade: its first message may be {"token"} (``_authenticate``).
        self.token_first = False
        self.origin: bytes | None = None
        self.host: bytes | None = None
        self.client: object = None
        self.token_deadline: Any = None

    # Autobahn callbacks

    def onConnect(self, request) -> None:
        headers = request.headers
        client = self.factory.requests.client_address(
            self.transport.getPeer(), headers.get("x-forwarded-for"), headers.get("forwarded")
        )
        self.client = client
        self.peer_address = proxies.describe(client)
        header = request.headers.get("authorization")
        authorization = None if header is None else header.encode("latin-1", "replace")
        self.origin, self.host = _header(request, "origin"), _header(request, "host")
        requests = self.factory.requests
        # A web page in a browser (or a DNS rebinding) is not the loopback admin.
        who = requests.operator(client, authorization, self.origin, self.host)
        self.authorization = authorization  # an account's token is checked again at reload
        # The console: a page the gateway served, whose token comes as the first message.
        self.token_first = (
            authorization is None
            and self.origin is not None
            and auth.own_origin(_text(self.origin), _text(self.host))
        )
        if isinstance(who, Answer):
            if self.token_first and who.status in (401, 429):
                # Admitted or closed by its first message: a right token always works.
                return
            self.factory.metrics.operator_socket(str(who.status))
            # Retry-After and WWW-Authenticate, as the HTTP routes send them.
            self.deny_headers = [(name.decode(), value.decode()) for name, value in who.headers]
            raise ConnectionDeny(who.status, who.body["error"]["message"])
        full = self._count(who)
        if full is not None:
            self.factory.metrics.operator_socket("429")
            raise ConnectionDeny(429, full)
        self.operator = who

    def _count(self, who: auth.Operator) -> str | None:
        """Count ``who``'s socket against its account's bound; why not, when it is full."""
        if who.account is None:
            return None
        held = self.factory.per_account
        if held.full(who.account, self.factory.max_per_account):
            return (
                f"account {who.account} already has {self.factory.max_per_account} "
                "operator sockets open; close one first"
            )
        held.take(who.account)
        self.counted = who.account
        return None

    def onOpen(self) -> None:
        factory = self.factory
        factory.connections.add(self)
        factory.metrics.operator_socket("open")
        self.start_sending()
        if self.operator is None:
            self.token_deadline = factory.clock.callLater(limits.REQUEST_DEADLINE, self._no_token)
            return
        log.info(
            "operator socket from {peer} opened ({who})",
            peer=self.peer_address,
            who="admin" if self.operator.admin else f"account {self.operator.account}",
        )

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        message_id = None
        try:
            if isBinary:
                raise errors.bad_request(
                    "binary frames are not read: send each request as JSON text"
                )
            if self.token_first:
                self.token_first = False
                if self._authenticate(payload):
                    return
            if self.operator is None:
                return  # being closed: it gave no token
            message_id, obj = read_message(payload)
            if obj.get("type") == WATCH_COMPUTERS:
                self._watch_computers(message_id, obj)
                return
            if obj.get("type") == WATCH_ACTIVITY:
                self._watch_activity(message_id, obj)
                return
            trapos_id, account = target(obj)
            self._start(message_id, trapos_id, account, obj)
        except GatewayError as error:
            self._answer(message_id, rejected(error))
        except Exception:
            log.failure("unexpected error handling a message from {peer}", peer=self.peer_address)
            # Never a second answer to an id whose first is still to come.
            self._answer(None if message_id in self.in_flight else message_id, INTERNAL)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        fixes.cancel_close_handshake_timer(self)
        if self.token_deadline is not None and self.token_deadline.active():
            self.token_deadline.cancel()
        self.factory.connections.discard(self)
        self._release()
        if self.outbound is not None:
            self.outbound.stopProducing()
        in_flight, self.in_flight = self.in_flight, {}
        for d in in_flight.values():
            d.cancel()
        if self.operator is not None:
            log.info(
                "operator socket from {peer} closed ({code}), {count} requests cancelled",
                peer=self.peer_address,
                code=code,
                count=len(in_flight),
            )

    # The console's token (the first message)

    def _authenticate(self, payload: bytes) -> bool:
        """
        Whether the first message was ``{"token"}`` (and was handled: the
        socket admitted, or closed 4001).  Anything else on a socket the
        upgrade did not admit is closed 4001 too.
        """
        try:
            authorization = token_message(json_object(payload, '{"token"}', "the message"))
        except GatewayError:
            authorization = None
        if authorization is None:
            if self.operator is None:
                self._unauthorized('send {"token": "..."} as the first message')
            return False
        if self.token_deadline is not None and self.token_deadline.active():
            self.token_deadline.cancel()
        if authorization or self.operator is None:
            requests = self.factory.requests
            who = requests.operator(self.client, authorization or None, self.origin, self.host)
            if isinstance(who, Answer):
                self._unauthorized(who.body["error"]["message"])
                return True
            self._release()
            full = self._count(who)
            if full is not None:
                self._unauthorized(full)
                return True
            self.operator, self.authorization = who, authorization or None
        log.info(
            "operator socket from {peer} authenticated ({who})",
            peer=self.peer_address,
            who="admin" if self.operator.admin else f"account {self.operator.account}",
        )
        self.outbound.send(orjson.dumps({"authenticated": True, "account": self.operator.account}))
        return True

    def _unauthorized(self, why: str) -> None:
        self.operator = None
        self.factory.metrics.operator_socket("401")
        self.close(wire.CLOSE_UNAUTHORIZED, why)

    def _no_token(self) -> None:
        self.token_first = False
        self._unauthorized(f"no token within {limits.REQUEST_DEADLINE:g} s")

    def _release(self) -> None:
        # Counted from onConnect's acceptance to the first onClose.
        account, self.counted = self.counted, None
        if account is None:
            return
        self.factory.per_account.give_back(account)

    # Requests

    def _room(self, message_id: str | int) -> bool:
        """Whether ``message_id`` may start (else it was answered, or raises ``bad_request``)."""
        factory = self.factory
        if message_id in self.in_flight:
            raise errors.bad_request(f"id {message_id!r} is already in flight on this connection")
        if len(self.in_flight) >= factory.max_in_flight:
            self._answer(
                message_id,
                error_answer(
                    503,
                    errors.OVERLOADED,
                    f"at most {factory.max_in_flight} requests in flight on one connection",
                ),
            )
            return False
        return True

    def _watch_computers(self, message_id: str | int, obj: dict[str, Any]) -> None:
        """The computers this operator sees, as partials, until the socket closes."""
        account = obj.get("account")
        if account is not None and type(account) is not str:
            raise errors.bad_request("account must be a string")
        if not self._room(message_id):
            return
        if self.watching in self.in_flight:
            self._answer(
                message_id,
                error_answer(
                    429,
                    errors.TOO_MANY_WATCHES,
                    f"this socket already watches the computers (id {self.watching!r}): "
                    "one watch_computers per socket",
                ),
            )
            return
        self.in_flight[message_id] = Deferred()  # a placeholder while the first listing goes
        self.watching = message_id
        watch = self.factory.requests.watch_computers(
            self.operator, account, lambda listing: self._listing(message_id, listing)
        )
        self.in_flight[message_id] = watch
        watch.addErrback(self._failed, message_id)

    def _watch_activity(self, message_id: str | int, obj: dict[str, Any]) -> None:
        """What is sent to one computer, as partials, until the socket closes."""
        trapos_id, account = target(obj)
        if not self._room(message_id):
            return
        account_id = self.factory.requests.account(self.operator, trapos_id, account)
        if type(account_id) is Answer:
            self._answer(message_id, account_id)
            return
        # Sent by this operator: an account's token is counted against its bound of watches.
        watch = self.factory.requests.watch_activity(
            Caller.of_operator(self.operator, account_id, trapos_id),
            lambda entry: self._partial(message_id, entry),
        )
        self.in_flight[message_id] = watch
        # (Cluster mode: it may end, with the answer saying why.)
        watch.addCallbacks(self._done, self._failed, (message_id,), None, (message_id,))

    def _start(self, message_id: str | int, trapos_id: str, account: str | None, obj: dict) -> None:
        factory = self.factory
        if not self._room(message_id):
            return
        if self.outbound.paused and self.dropped:
            # Not reading its answers (some already had no room): start no more work for it.
            self._answer(message_id, error_answer(503, errors.OVERLOADED, "answers are not read"))
            return
        self.dropped = False
        requests = factory.requests
        account_id = requests.account(self.operator, trapos_id, account)
        if type(account_id) is Answer:
            self._answer(message_id, account_id)
            return
        # A placeholder while it starts: an ask's first partials may come before its Deferred.
        self.in_flight[message_id] = Deferred()
        try:
            result = requests.send(
                Caller.of_operator(self.operator, account_id, trapos_id),
                obj,
                lambda frame: self._partial(message_id, frame),
                self._room_for_frames,
                self.connection,
            )
        finally:
            del self.in_flight[message_id]
        if type(result) is Answer:
            self._answer(message_id, result)
            return
        self.in_flight[message_id] = result
        result.addCallbacks(self._done, self._failed, (message_id,), None, (message_id,))

    def _done(self, answer: Answer, message_id: str | int) -> None:
        if self.in_flight.pop(message_id, None) is not None:
            self._answer(message_id, answer)

    def _failed(self, failure: Failure, message_id: str | int) -> None:
        if self.in_flight.pop(message_id, None) is None:
            return  # cancelled by our close
        if failure.check(CancelledError):
            self._answer(message_id, CANCELLED)
            return
        log.failure("a request from {peer} failed", failure, peer=self.peer_address)
        self._answer(message_id, INTERNAL)

    def _partial(self, message_id: str | int, payload: dict[str, Any]) -> None:
        self._send_partial(message_id, orjson.dumps(payload))

    def _listing(self, message_id: str | int, listing: Listing) -> None:
        """A ``watch_computers`` partial: the listing's JSON, shared by its watchers."""
        self._send_partial(message_id, listing.encoded)

    def _send_partial(self, message_id: str | int, payload: bytes) -> None:
        """A partial answer to ``message_id`` with ``payload``, JSON already encoded (spliced)."""
        if self.state != WebSocketProtocol.STATE_OPEN or message_id not in self.in_flight:
            return
        message = b'{"id":%b,"status":200,"partial":true,"payload":%b}' % (
            orjson.dumps(message_id),
            payload,
        )
        try:
            self.outbound.send(message)
        except GatewayError:
            self.dropped = True
            log.debug("a partial to {peer} dropped: it is not reading", peer=self.peer_address)

    def _room_for_frames(self) -> Deferred[None] | None:
        """None when a screen frame would be sent now, else a Deferred of when it would be
        (not queued behind a full transport)."""
        if self.outbound is not None and self.outbound.paused:
            return self.outbound.when_resumed()
        return None

    def _answer(self, message_id: str | int | None, answer: Answer) -> None:
        self.factory.metrics.operator_socket_request(answer.status)
        if self.state != WebSocketProtocol.STATE_OPEN:
            return
        try:
            self.outbound.send(encode_answer(message_id, answer))
        except GatewayError:
            self.dropped = True
            log.debug("an answer to {peer} dropped: it is not reading", peer=self.peer_address)

    def who(self) -> str:
        return f"operator socket from {self.peer_address}"


class OperatorSocketFactory(WebSocketServerFactory):
    """Shared state of all operator WebSocket connections."""

    protocol = OperatorSocket

    def __init__(
        self,
        requests: OperatorRequests,
        clock: IReactorTime,
        metrics: Metrics,
        max_in_flight: int = limits.MAX_OPERATOR_IN_FLIGHT,
        max_queued_bytes: int = limits.MAX_QUEUED_BYTES,
        stall_timeout: float = limits.STALL_TIMEOUT,
        auto_ping_interval: float = limits.AUTO_PING_INTERVAL,
        auto_ping_timeout: float = limits.AUTO_PING_TIMEOUT,
        max_per_account: int = limits.MAX_OPERATOR_SOCKETS_PER_ACCOUNT,
    ) -> None:
        super().__init__()
        self.requests = requests
        self.clock = clock
        self.metrics = metrics
        self.max_in_flight = max_in_flight
        self.max_queued_bytes = max_queued_bytes
        self.stall_timeout = stall_timeout
        self.connections: set[OperatorSocket] = set()
        self.max_per_account = max_per_account
        # Sockets accepted and not yet closed, by account (account tokens only).
        self.per_account = Tally()
        self.setProtocolOptions(
            **server_options(limits.MAX_BODY_BYTES, auto_ping_interval, auto_ping_timeout)
        )

    def revoke(self, admission: auth.Admission) -> int:
        """
        Close (4001) the sockets of account tokens that no longer admit their
        account, after the accounts file was read again; how many.
        """
        closed = 0
        for connection in list(self.connections):
            operator = connection.operator
            if operator is None or operator.admin:
                continue  # the admin token is not in the accounts file
            if not admission.token_still_admits(operator.account, connection.authorization):
                connection.close(wire.CLOSE_UNAUTHORIZED, "unauthorized")
                closed += 1
        return closed

    def shutdown(self) -> None:
        """Close every operator connection with 1000 (their requests are answered first)."""
        for connection in list(self.connections):
            connection.close(wire.CLOSE_NORMAL, "server shutting down")
