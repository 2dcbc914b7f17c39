"""
The port's HTTP/1.1 server: twisted.web's channel, request and site, bounded
for strangers and deciding an operator request at its head.

- ``GatewayChannel``: a request's head and body must arrive within
  ``REQUEST_DEADLINE`` of its first byte (408), and a refused request's
  answer is the connection's last.
- ``GatewayRequest``: when its head is complete, before any byte of its body
  is read, the site's ``decide`` (``GatewayApp.decide``) says who asks; a
  refused caller is answered there and its body never kept.
- ``GatewaySite``: a body is kept in memory up to ``MAX_BODY_BYTES`` and
  dropped past it (``_CappedContent``: the route answers 413), never spooled
  to disk; no access log line per request.

What a request means is the app's (``trapsandbox.web.app``); which requests
an operator must be admitted for is ``operator_route`` here, since the head
is all there is to go on.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote_to_bytes

from twisted.python.failure import Failure
from twisted.web.http import datetimeToString
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource
from twisted.web.server import Request, Site

from trapsandbox import limits
from trapsandbox.compat import fixes
from trapsandbox.compat.rawhttp import response
from trapsandbox.limits import MAX_BODY_BYTES
from trapsandbox.web.operator import REQUEST_TIMEOUT, Answer


class _CappedContent(io.BytesIO):
    """A request body kept in memory up to a limit; past it, dropped and flagged."""

    def __init__(self, limit: int, over_limit: bool = False) -> None:
        super().__init__()
        self._limit = limit
        self.over_limit = over_limit

    def write(self, data: bytes) -> int:
        if not self.over_limit:
            if self.tell() + len(data) > self._limit:
                self.over_limit = True
                self.seek(0)
                self.truncate()
            else:
                super().write(data)
        return len(data)


# The head's decision on a request for no operator route: nothing to admit, and
# no route of it reads a body.
PUBLIC = "public"
# ... on ``POST /mcp`` with an ask's own token (SPEC §11): the route finds its scope.
ASK = "ask"


def operator_route(method: bytes, target: bytes) -> str | None:
    """
    The operator route a request line names: ``computers``, ``metrics``,
    ``mcp`` (POST, and GET: a client's subscription stream; other methods are a
    405 for anyone), or None.  The
    first path segment is %-decoded as twisted.web's traversal decodes it.
    """
    if not target.startswith(b"/"):
        return None
    first = unquote_to_bytes(target[1:].split(b"?", 1)[0].split(b"/", 1)[0])
    if first in (b"computers", b"metrics") or (first == b"mcp" and method in (b"POST", b"GET")):
        return first.decode("ascii")
    return None


class GatewayChannel(fixes.BoundedContentLength):
    """
    twisted.web's channel, bounded for strangers (SPEC §4 "Nothing is buffered
    for a stranger"): a request's head and body must arrive within
    ``REQUEST_DEADLINE`` of its first byte (else 408 and close; Twisted's own
    idle timeout is reset by every byte), and a refused request's answer is
    the connection's last (``refuse``).
    """

    # Set by what listens (``front.hand_over``, ``listener.CountedSite``): the place of the
    # connection among its address's connections not yet admitted (``admission.strangers``).
    ticket: Any = None
    _deadline: Any = None
    _abort: Any = None
    # A request is whole and being answered (no deadline), or the connection is closing.
    _answering = False
    _closing = False

    def dataReceived(self, data: bytes) -> None:
        if self._deadline is None and not self._answering and not self._closing:
            self._deadline = self.callLater(limits.REQUEST_DEADLINE, self._too_slow)
        super().dataReceived(data)

    def allContentReceived(self) -> None:
        self._stop_deadline()
        self._answering = True
        super().allContentReceived()

    def requestDone(self, request: IRequest) -> None:
        self._answering = False
        # (Requests that arrived meanwhile are read now: dataReceived again.)
        super().requestDone(request)

    def admitted(self) -> None:
        """A request on this connection was admitted: it is no stranger's."""
        ticket, self.ticket = self.ticket, None
        if ticket is not None:
            ticket.admitted()

    def refuse(self, answer: Answer) -> None:
        """Send ``answer`` as the connection's last, and close it without reading more."""
        self._closing = True
        self._stop_deadline()
        self.persistent = False
        self.write(response(answer, datetimeToString(), close=True))
        self.loseConnection()
        # A client that does not read its answer is not waited for (as fasthttp).
        self.setTimeout(None)
        self._abort = self.callLater(limits.HTTP_ABORT_AFTER, self.transport.abortConnection)

    def _too_slow(self) -> None:
        self._deadline = None
        if not self._answering and not self._closing:
            self.refuse(REQUEST_TIMEOUT)

    def _stop_deadline(self) -> None:
        deadline, self._deadline = self._deadline, None
        if deadline is not None and deadline.active():
            deadline.cancel()

    def connectionLost(self, reason: Failure) -> None:
        self._stop_deadline()
        if self._abort is not None and self._abort.active():
            self._abort.cancel()
        self.admitted()  # gone: no longer waiting
        super().connectionLost(reason)


class GatewayRequest(Request):
    """
    A request decided at its head: who asks is known before any byte of its
    body is read, and a caller who may not send one is answered at once
    (``GatewayChannel.refuse``), its body never kept.
    """

    # The head's decision: an ``auth.Operator``, ``PUBLIC``, ``ASK``, or None
    # (not decided at the head: the route decides).
    admitted: Any = None
    _refused = False

    def gotLength(self, length: int | None) -> None:
        # Called by HTTPChannel.allHeadersReceived, before the body (fixes.request_line).
        channel = self.channel
        line = fixes.request_line(self)
        decide = getattr(channel.site, "decide", None)
        decision = None if line is None or decide is None else decide(self, *line)
        if isinstance(decision, Answer):
            self._refused = True
            # No "100 Continue" after the answer (HTTPChannel sends it after gotLength).
            self.requestHeaders.removeHeader(b"expect")
            self.content = _CappedContent(0)
            channel.refuse(decision)
            return
        self.admitted = decision
        if decision is not None:
            channel.admitted()
        if decision is PUBLIC:
            self.content = _CappedContent(0)  # no such route reads a body: keep none
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        if not self._refused:
            super().handleContentChunk(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if not self._refused:  # (what a refused request's body held is not served)
            super().requestReceived(command, path, version)


class GatewaySite(Site):
    """
    A ``Site`` that never spools a large request body to memory or disk, and
    reads an operator request's body only once its head is admitted
    (``decide``, ``GatewayApp.decide``).
    """

    displayTracebacks = False
    protocol = GatewayChannel
    requestFactory = GatewayRequest

    def __init__(
        self,
        resource: IResource,
        timeout: float = limits.HTTP_IDLE_TIMEOUT,
        decide: Callable[[IRequest, bytes, bytes], Any] | None = None,
    ) -> None:
        # No route reads form fields: skip parsing every POST's content type
        # for them (a quarter of an operator request's CPU).
        super().__init__(resource, timeout=timeout, parsePOSTFormSubmission=False)
        self.decide = decide

    def getContentFile(self, length: int | None) -> _CappedContent:
        return _CappedContent(MAX_BODY_BYTES, length is not None and length > MAX_BODY_BYTES)

    def log(self, request: IRequest) -> None:
        # No access line per HTTP request: an agent or a fleet's operator pings make
        # thousands a second (a tenth of a request's CPU, and a flooded journal).
        # Refusals, failures and every computer's connect and close are logged.
        pass
