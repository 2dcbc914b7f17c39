"""
The operator's hot route read off the socket: ``POST /computers/{id}/requests``
without twisted.web.

An agent or an operator working across a fleet sends thousands of these a
second on kept-alive connections, and twisted.web's per-request machinery
(``LineReceiver``, ``Headers``, ``Request`` and its resource traversal) was
most of their cost.  ``FastHTTP`` reads each request's head itself and serves
it when it is the plain case: ``POST /computers/{traposId}/requests[?query]
HTTP/1.1`` with one ``Content-Length`` (at most ``MAX_BODY_BYTES``), no
``Transfer-Encoding``, no ``Expect`` and no ``Connection`` other than
keep-alive.  Anything else (another route, chunked, a malformed or
oversized head, HTTP/1.0, ``Connection: close``) is the site's: at that
request's first byte, with nothing of ours still to answer, the connection is
handed to twisted.web for good, as the port's first-bytes router does
(``front.hand_over``), and twisted.web answers it as it always has.

What the request means is ``operator.OperatorRequests.http``, the same call
twisted.web's route makes; the rules of a connection are twisted.web's: one
request at a time (later ones are buffered, and reading stops past 16 KiB of
them), no idle timeout while a request is answered, and the connection closed
after ``HTTP_IDLE_TIMEOUT`` without a byte from the client.  A client that
goes away cancels its request.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs, unquote_to_bytes

from twisted.internet import protocol
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime, ITCPTransport
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox import limits
from trapsandbox.admission import auth
from trapsandbox.compat.rawhttp import Dates, response
from trapsandbox.computers import wire
from trapsandbox.web.operator import (
    INTERNAL,
    NO_SUCH_COMPUTER,
    REQUEST_TIMEOUT,
    Answer,
    OperatorRequests,
)

log = Logger()

# twisted.web's own bounds on a request's head, so that what is handed over
# meets the same limits.
MAX_HEAD_BYTES = 16384
MAX_HEADERS = 500
# Bytes of later requests kept while one is answered before reading stops
# (twisted.web's ``_optimisticEagerReadSize``).
MAX_BUFFERED = 0x4000


class _Plain:
    """A request head read and found to be the hot route's plain case."""

    __slots__ = ("fields", "length", "query", "segment", "target")

    def __init__(self, target: bytes, segment: bytes, query: bytes, fields: _Fields) -> None:
        self.target = target
        self.segment = segment
        self.query = query
        self.length = fields.length
        self.fields = fields


# The request line of the hot route: one path segment (the traposId, %-encoded), a
# query perhaps (``?account=``).
_REQUEST_LINE = re.compile(
    rb"POST (/computers/([^/?#\x00-\x20\x7f]+)/requests(?:\?([^#\x00-\x20\x7f]*))?) HTTP/1\.1"
)
_TOKEN = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
# Header lines as RFC 9112 has them: no folding, no space before the colon.
_FIELDS = re.compile(rb"(?:" + _TOKEN + rb":[^\r\n]*(?:\r\n|$))*")
_FIELD = re.compile(rb"(" + _TOKEN + rb"):[ \t]*([^\r\n]*)")


def read_head(head: bytes) -> _Plain | None:
    """
    ``head`` (a request's bytes up to, not including, the blank line) as the
    hot route's plain case, or None: the site's to answer.
    """
    if len(head) > MAX_HEAD_BYTES:
        return None
    line_end = head.find(b"\r\n")
    if line_end < 0:
        return None
    line = _REQUEST_LINE.fullmatch(head, 0, line_end)
    if line is None:
        return None
    fields = head[line_end + 2 :]
    known = _FIELDS_READ.get(fields)
    if known is None:
        known = _read_fields(fields)
        if len(fields) <= _FIELDS_KEPT_BYTES:
            _remember(_FIELDS_READ, fields, known)
    if known is _NOT_PLAIN:
        return None
    target, segment, query = line.groups()
    return _Plain(target, segment, query or b"", known)


# A client sends the same header lines again and again (the path, in the request
# line, is what changes): what they were read as, for the last few thousand kinds.
_FIELDS_READ: dict[bytes, Any] = {}
_FIELDS_KEPT_BYTES = 1024
# How many of each kind of thing read are remembered (then forgotten all at once).
_KEPT = 4096


def _remember(memo: dict[bytes, Any], key: bytes, value: Any) -> None:
    if len(memo) >= _KEPT:
        memo.clear()
    memo[key] = value


_NOT_PLAIN = object()


class _Fields:
    """What the hot route reads of a plain request's header lines."""

    __slots__ = (
        "authorization",
        "content_type",
        "forwarded",
        "host",
        "length",
        "origin",
        "x_forwarded_for",
    )

    def __init__(self, length: int, kept: dict[bytes, bytes], forwarding: dict) -> None:
        self.length = length
        self.authorization = kept.get(b"authorization")
        self.origin = kept.get(b"origin")
        self.host = kept.get(b"host")
        self.content_type = kept.get(b"content-type")
        # Each all its lines joined with ", ", or None; believed only from a trusted
        # proxy (``OperatorRequests.client_address``).
        self.x_forwarded_for = _joined(forwarding.get(b"x-forwarded-for"))
        self.forwarded = _joined(forwarding.get(b"forwarded"))


def _joined(lines: list[str] | None) -> str | None:
    return None if lines is None else ", ".join(lines)


# The header lines the decision on a request reads (each at most once, or the site's).
_KEPT_FIELDS = frozenset((b"authorization", b"origin", b"host", b"content-type"))


def _read_fields(fields: bytes) -> _Fields | object:
    """The ``_Fields`` of plain header lines, or ``_NOT_PLAIN``."""
    if _FIELDS.fullmatch(fields) is None:
        return _NOT_PLAIN
    found = _FIELD.findall(fields)
    if len(found) > MAX_HEADERS:
        return _NOT_PLAIN
    length = None
    kept: dict[bytes, bytes] = {}
    forwarding: dict[bytes, list[str]] = {}
    for name, value in found:
        name = name.lower()
        if name == b"content-length":
            value = value.rstrip(b" \t")
            if length is not None or not value.isdigit() or len(value) > 18:
                return _NOT_PLAIN  # (twisted.web answers a length past any body 400 or 413)
            length = int(value)
        elif name in _KEPT_FIELDS:
            if name in kept:
                return _NOT_PLAIN
            kept[name] = value.rstrip(b" \t")
        elif name == b"transfer-encoding" or name == b"expect":
            return _NOT_PLAIN
        elif name == b"connection" and value.rstrip(b" \t").lower() != b"keep-alive":
            return _NOT_PLAIN
        elif name == b"x-forwarded-for" or name == b"forwarded":
            forwarding.setdefault(name, []).append(value.rstrip(b" \t").decode("latin-1"))
    if length is None or length > limits.MAX_BODY_BYTES:
        return _NOT_PLAIN
    return _Fields(length, kept, forwarding)


# The traposIds of the path segments seen lately (``7%3Abase`` -> ``7:base``).
_IDS: dict[bytes, str | None] = {}
_UNSEEN = object()


def _trapos_id(segment: bytes) -> str | None:
    """The traposId a %-encoded path segment names; None if it is not UTF-8."""
    known = _IDS.get(segment, _UNSEEN)
    if known is not _UNSEEN:
        return known
    try:
        trapos_id = (unquote_to_bytes(segment) if b"%" in segment else segment).decode("utf-8")
    except UnicodeDecodeError:
        trapos_id = None
    _remember(_IDS, segment, trapos_id)
    return trapos_id


def _asked_account(query: bytes) -> str | None:
    if not query:
        return None
    values = parse_qs(query, keep_blank_values=True).get(b"account")
    if not values:
        return None
    return values[0].decode("utf-8", "replace")


class FastHTTP(protocol.Protocol):
    """
    One HTTP connection while its requests are the hot route's plain case.

    Who asks is decided when a request's head is complete, before its body
    is waited for (SPEC §4 "Nothing is buffered for a stranger"): a refused
    caller is answered at once and the connection closed, unread.  A
    request's head and body must arrive within ``REQUEST_DEADLINE`` of its
    first byte (else 408 and close).
    """

    # Set by ``front.hand_over``: this connection's place among its address's
    # connections not yet admitted (``admission.strangers``); None once admitted.
    ticket: Any = None

    def __init__(
        self,
        requests: OperatorRequests,
        site: Any,
        hand_over: Any,
        address: Any,
        clock: IReactorTime,
        dates: Dates,
    ) -> None:
        self._requests = requests
        self._site = site
        self._hand_over = hand_over
        self._address = address
        self._clock = clock
        self._dates = dates
        self._buffer = b""
        # A body still arriving: its pieces so far (None otherwise), and the
        # buffer's length that completes the request.
        self._pieces: list[bytes] | None = None
        self._have = 0
        self._need = 0
        self._serving = False
        # The answer being waited for: its Deferred (None while no request is answered).
        self._answering: Deferred | None = None
        self._busy = False
        # Reading stops while too much waits behind a request, or while the
        # transport cannot take our answers (we are its producer).
        self._buffer_full = False
        self._writes_full = False
        self._reading_paused = False
        self._gone = False
        self._last = 0.0
        self._timer: Any = None
        # The operator of the request whose body is still arriving.
        self._operator: auth.Operator | None = None
        # The last head admitted on this connection (its ``_Fields``, read once per kind
        # of head: ``read_head``), under which admission state, and whom it admitted: a
        # decision that depends only on them (``OperatorRequests.admission_state``).
        self._admitted_fields: _Fields | None = None
        self._admitted_under: object = None
        self._admitted: auth.Operator | None = None
        # The current request must be whole by then (REQUEST_DEADLINE), and is
        # refused or timed out: answered, and closing.
        self._deadline: Any = None
        self._closing = False

    def connectionMade(self) -> None:
        if ITCPTransport.providedBy(self.transport):
            self.transport.setTcpNoDelay(True)
        self._last = self._clock.seconds()
        self._timer = self._clock.callLater(limits.HTTP_IDLE_TIMEOUT, self._idle)
        # A client that sends requests without reading the answers stops being read
        # (as twisted.web's channel does), rather than growing the write buffer.
        self.transport.registerProducer(self, True)

    # IPushProducer: the transport's write buffer is full, then drained.

    def pauseProducing(self) -> None:
        self._writes_full = True
        self._update_reading()

    def resumeProducing(self) -> None:
        self._writes_full = False
        self._update_reading()
        if not self._busy and not self._serving and not self._gone:
            self._serve()

    def stopProducing(self) -> None:
        pass  # the connection is lost: connectionLost follows

    def _update_reading(self) -> None:
        paused = self._buffer_full or self._writes_full
        if paused != self._reading_paused and not self._gone:
            self._reading_paused = paused
            if paused:
                self.transport.pauseProducing()
            else:
                self.transport.resumeProducing()

    def dataReceived(self, data: bytes) -> None:
        if self._closing:
            return
        self._last = self._clock.seconds()
        if self._pieces is not None:
            # A large body comes in many reads: join them once, not once per read.
            self._pieces.append(data)
            self._have += len(data)
            if self._have < self._need:
                return
            self._buffer = b"".join(self._pieces)
            self._pieces = None
        else:
            self._buffer = self._buffer + data if self._buffer else data
        if self._busy or self._writes_full:
            if len(self._buffer) > MAX_BUFFERED and not self._buffer_full:
                self._buffer_full = True
                self._update_reading()
            return
        self._serve()

    def _serve(self) -> None:
        """Answer every whole request buffered, until one must wait or is the site's."""
        self._serving = True
        try:
            self._serve_buffered()
        finally:
            self._serving = False

    def _serve_buffered(self) -> None:
        while not self._busy and not self._gone and not self._writes_full:
            buffer = self._buffer
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_HEAD_BYTES or (buffer and not _could_be_plain(buffer)):
                    self._give_up()
                elif buffer:
                    self._start_deadline()
                else:
                    self._stop_deadline()
                return
            plain = read_head(buffer[:end])
            if plain is None:
                self._give_up()
                return
            operator = self._operator or self._admit(plain)
            if operator is None:
                return  # refused: answered, and closing
            start = end + 4
            if len(buffer) - start < plain.length:
                # The body is still coming.
                self._operator = operator
                self._pieces = [buffer]
                self._have = len(buffer)
                self._need = start + plain.length
                self._start_deadline()
                return
            self._operator = None
            self._stop_deadline()
            body = buffer[start : start + plain.length]
            self._buffer = buffer[start + plain.length :]
            self._answer(plain, body, operator)

    def _admit(self, plain: _Plain) -> auth.Operator | None:
        """The operator of a request whose head is ``plain``; None: refused and closing."""
        fields = plain.fields
        state = self._requests.admission_state
        if fields is self._admitted_fields and state is self._admitted_under:
            # The same head lines from the same peer as the last request admitted here:
            # the same decision (a refusal is never kept, since a refusal counts).
            return self._admitted
        client = self._address
        if fields.x_forwarded_for is not None or fields.forwarded is not None:
            client = self._requests.client_address(client, fields.x_forwarded_for, fields.forwarded)
        who = self._requests.admit(
            b"POST",
            client,
            fields.authorization,
            fields.origin,
            fields.host,
            fields.content_type,
        )
        if type(who) is Answer:
            self._close_with(response(who, self._dates.now(), close=True))
            return None
        if self.ticket is not None:
            self.ticket.admitted()
            self.ticket = None
        self._admitted_fields = fields
        self._admitted_under = state
        self._admitted = who
        return who

    def _start_deadline(self) -> None:
        if self._deadline is None:
            self._deadline = self._clock.callLater(limits.REQUEST_DEADLINE, self._too_slow)

    def _stop_deadline(self) -> None:
        if self._deadline is not None:
            if self._deadline.active():
                self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if not self._gone and not self._closing:
            self._close_with(response(REQUEST_TIMEOUT, self._dates.now(), close=True))

    def _close_with(self, data: bytes) -> None:
        """Send ``data``, the connection's last answer, and close without reading more."""
        self._closing = True
        self._buffer = b""
        self._pieces = None
        self._stop_deadline()
        self._cancel_timer()
        self.transport.write(data)
        self.transport.loseConnection()
        # A client that does not read its answer is not waited for.
        self._timer = self._clock.callLater(limits.HTTP_ABORT_AFTER, self.transport.abortConnection)

    def _answer(self, plain: _Plain, body: bytes, operator: auth.Operator) -> None:
        trapos_id = _trapos_id(plain.segment)
        if trapos_id is None:
            self._send(NO_SUCH_COMPUTER)
            return
        fields = plain.fields
        result = self._requests.http(
            self._address,
            fields.authorization,
            trapos_id,
            _asked_account(plain.query),
            body,
            admitted=operator,
        )
        if type(result) is Answer:
            self._send(result)
            return
        self._busy = True
        self._answering = result
        result.addCallbacks(self._answered, self._failed, errbackArgs=(plain.target,))

    def _answered(self, answer: Answer) -> None:
        self._answering = None
        self._busy = False
        if self._gone:
            return
        self._send(answer)
        self._last = self._clock.seconds()
        if self._buffer_full:
            self._buffer_full = False
            self._update_reading()
        # (An answer at once: the loop goes on by itself.  Nothing buffered: no request
        # and no deadline, which starts only with a request's first bytes.)
        if self._buffer and not self._serving:
            self._serve()

    def _failed(self, failure: Failure, target: bytes) -> None:
        if failure.check(CancelledError):
            if self._gone:
                self._answering = None  # the client went away: nobody to answer
                return
        else:
            log.failure("POST {uri} failed", failure, uri=wire.cut(target.decode("latin-1")))
        self._answered(INTERNAL)

    def _send(self, answer: Answer) -> None:
        self.transport.write(response(answer, self._dates.now()))

    def _give_up(self) -> None:
        """The rest of this connection is the site's, from the buffered request on."""
        self._cancel_timer()
        self._stop_deadline()
        self._buffer_full = self._writes_full = False
        self._update_reading()
        # twisted.web's channel registers itself as the producer.
        self.transport.unregisterProducer()
        buffer, self._buffer = self._buffer, b""
        self._gone = True  # for this protocol: the site's from here
        ticket, self.ticket = self.ticket, None
        self._hand_over(self.transport, self._site, self._address, buffer, ticket)

    def _idle(self) -> None:
        self._timer = None
        if self._gone or self._closing:
            return
        wait = self._last + limits.HTTP_IDLE_TIMEOUT - self._clock.seconds()
        if self._busy or wait > 0:
            self._timer = self._clock.callLater(
                limits.HTTP_IDLE_TIMEOUT if self._busy else wait, self._idle
            )
            return
        self.transport.loseConnection()
        self._timer = self._clock.callLater(limits.HTTP_ABORT_AFTER, self.transport.abortConnection)

    def connectionLost(self, reason: Any) -> None:
        self._gone = True
        self._cancel_timer()
        self._stop_deadline()
        if self.ticket is not None:
            self.ticket.admitted()  # gone: no longer waiting
            self.ticket = None
        answering, self._answering = self._answering, None
        if answering is not None:
            answering.cancel()

    def _cancel_timer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None


_START = b"POST /computers/"


def _could_be_plain(buffer: bytes) -> bool:
    """Whether a head still arriving may be the plain case (else the site takes it now)."""
    if len(buffer) < len(_START):
        return _START.startswith(buffer)
    return buffer.startswith(_START)


class FastHTTPFactory:
    """Makes the ``FastHTTP`` for a connection the first-bytes router gives it."""

    def __init__(
        self, requests: OperatorRequests, site: Any, hand_over: Any, clock: IReactorTime
    ) -> None:
        self._requests = requests
        self._site = site
        self._hand_over = hand_over
        self._clock = clock
        self._dates = Dates(clock)

    def buildProtocol(self, address: Any) -> FastHTTP:
        return FastHTTP(
            self._requests, self._site, self._hand_over, address, self._clock, self._dates
        )
