"""
Small in-process servers on 127.0.0.1:0 standing in for opencode, healthy or faulty.

``listen`` stops the port *and* every connection it accepted at cleanup, so a server that
never answers leaves nothing behind on the reactor.
"""

from __future__ import annotations

import base64

from twisted.internet import protocol
from twisted.internet.defer import Deferred, succeed
from twisted.protocols.policies import WrappingFactory
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from tests.harness.support import bounded, reactor


class _Tracked(WrappingFactory):
    """Keeps the connections it accepted, so they can be closed at the end."""

    def __init__(self, wrapped) -> None:
        super().__init__(wrapped)
        self._drained: list[Deferred] = []

    def unregisterProtocol(self, p) -> None:
        super().unregisterProtocol(p)
        if not self.protocols:
            drained, self._drained = self._drained, []
            for d in drained:
                d.callback(None)

    def drained(self) -> Deferred:
        if not self.protocols:
            return succeed(None)
        d = Deferred()
        self._drained.append(d)
        return d


def listen(testcase, factory) -> int:
    """Serve ``factory`` on a loopback port until the test's cleanup; returns the port."""
    tracked = _Tracked(factory)
    port = reactor().listenTCP(0, tracked, interface="127.0.0.1")

    async def stop():
        await port.stopListening()
        for each in list(tracked.protocols):
            each.transport.abortConnection()
        await bounded(tracked.drained())

    testcase.addCleanup(lambda: Deferred.fromCoroutine(stop()))
    return port.getHost().port


def serve(testcase, resource: Resource) -> str:
    """An HTTP server for ``resource`` (all paths); returns its base URL."""
    site = Site(resource)
    site.timeOut = None  # no idle timer left on the reactor
    site.noisy = False
    return f"http://127.0.0.1:{listen(testcase, site)}"


def basic(username: str, password: str) -> str:
    """The value of an ``Authorization`` header for HTTP Basic auth."""
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode("ascii")


class Opencode(Resource):
    """
    Answers every path like opencode's ``/config``: JSON, or 401 when ``password`` is set and
    the Basic credentials are wrong.  Records each request's ``Authorization`` header.
    """

    isLeaf = True

    def __init__(self, password: str | None = None, username: str = "opencode") -> None:
        super().__init__()
        self.expected = None if password is None else basic(username, password)
        self.authorizations: list[str | None] = []
        self.arrived: Deferred = Deferred()

    def render_GET(self, request):
        header = request.getHeader(b"authorization")
        self.authorizations.append(None if header is None else header.decode("latin-1"))
        if not self.arrived.called:
            self.arrived.callback(request)
        if self.expected is not None and self.authorizations[-1] != self.expected:
            request.setResponseCode(401)
            request.setHeader(b"www-authenticate", b'Basic realm="Secure Area"')
            return b"Unauthorized"
        request.setHeader(b"content-type", b"application/json")
        return b'{"username":"opencode"}'


class Fixed(Resource):
    """Answers every request with one status, content type and body."""

    isLeaf = True

    def __init__(self, code: int, content_type: bytes, body: bytes, headers=()) -> None:
        super().__init__()
        self.code, self.content_type, self.body, self.headers = code, content_type, body, headers
        self.requests = 0

    def render(self, request):
        self.requests += 1
        request.setResponseCode(self.code)
        request.setHeader(b"content-type", self.content_type)
        for name, value in self.headers:
            request.setHeader(name, value)
        return self.body


class StallsAfterHeaders(Resource):
    """Sends the status, the headers and part of a JSON body, then nothing, ever."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.stalled: Deferred = Deferred()

    def render(self, request):
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"content-length", b"1000")
        request.write(b'{"username":')
        if not self.stalled.called:
            self.stalled.callback(request)
        return NOT_DONE_YET


class Held(Resource):
    """Holds the one request it gets for the test to answer: ``arrived`` fires with it."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.arrived: Deferred = Deferred()

    def render(self, request):
        self.arrived.callback(request)
        return NOT_DONE_YET


class _Silent(protocol.Protocol):
    def connectionMade(self) -> None:
        self.factory.accepted += 1
        if not self.factory.arrived.called:
            self.factory.arrived.callback(self)


class Silent(protocol.ServerFactory):
    """Accepts TCP connections, reads the request, and never answers."""

    protocol = _Silent
    noisy = False

    def __init__(self) -> None:
        self.accepted = 0
        self.arrived: Deferred = Deferred()
