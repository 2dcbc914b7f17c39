"""
Where the gateway reaches into Autobahn's and Twisted's internals to be
correct, in both modes (the plain one too: ``SANDBOX_FAST_PATHS=0``).

None of these is for speed (those are ``trapsandbox.fast.patches``, installed by
``trapsandbox.fast.paths.install`` in fast mode only) and none replaces a
library name for the whole process: each is a mixin the gateway's own classes
inherit, or a call they make.  Each relies on a name the libraries do not
promise to keep; ``tests/unit/compat/test_fixes.py`` fails loudly when an upgrade
moves one.
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

from twisted.internet.error import AlreadyCalled, AlreadyCancelled
from twisted.web import http


class BoundedContentLength(http.HTTPChannel):
    """
    twisted.web reads ``Content-Length`` with ``int()``, which raises on more
    than 4,300 digits: the exception escaped the channel, the reactor logged
    a traceback and dropped the connection.  A length of more than 18 digits
    (past any body) is answered 400 like any other bad length.
    """

    def _maybeChooseTransferDecoder(self, header: bytes, data: bytes) -> bool:
        if header == b"Content-Length" and len(data) > 18:
            return self._failChooseTransferDecoder()  # 400, as for any bad length
        return super()._maybeChooseTransferDecoder(header, data)


def request_line(request: Any) -> tuple[bytes, bytes] | None:
    """
    The method and target of a request whose head is complete but whose
    body is not read yet (from ``Request.gotLength``), or None if unknown.

    twisted.web sets ``request.method`` and ``request.uri`` only when the
    body has arrived (``requestReceived``); until then ``HTTPChannel`` keeps
    the request line as ``_command`` and ``_path``, and calls ``gotLength``
    from ``allHeadersReceived``, after the last header and before any byte
    of the body.  ``web.GatewayRequest`` decides there who may send a body.
    """
    channel = request.channel
    method = getattr(channel, "_command", None)
    target = getattr(channel, "_path", None)
    if type(method) is not bytes or type(target) is not bytes:
        return None
    return method, target


def cancel_close_handshake_timer(protocol: Any) -> None:
    """
    Autobahn keeps its close-handshake timer when the peer drops the
    connection instead of answering our close; call from ``onClose`` so that
    nothing is left to time out (and no test reactor is left dirty).
    """
    call = getattr(protocol, "closeHandshakeTimeoutCall", None)
    if call is not None:
        protocol.closeHandshakeTimeoutCall = None
        with suppress(AlreadyCalled, AlreadyCancelled):
            call.cancel()


def failed_by_us(protocol: Any) -> bool:
    """
    Whether Autobahn itself failed the connection (e.g. after the peer's bad
    frame): its answering close frame may still be unsent.
    """
    return protocol.failedByMe


def exit_zero_after_stop_signal(reactor: Any) -> None:
    """
    twistd re-raises the signal that stopped the reactor at exit, so the
    process dies "killed by SIGTERM"; a graceful stop is a success, so forget
    the signal and exit 0.
    """
    if getattr(reactor, "_exitSignal", None) is not None:
        reactor._exitSignal = None


class HeadersOnDeny:
    """
    A server protocol whose ``ConnectionDeny`` goes out with ``deny_headers``.

    ``ConnectionDeny`` carries a status and a reason but no headers, and
    Autobahn answers it with ``failHandshake(reason, code)``, which could
    send headers but is given none; set ``deny_headers`` (``(name, value)``
    strings) before raising it, and they are added there (Retry-After, say).
    """

    deny_headers: list[tuple[str, str]] | None = None

    def failHandshake(self, reason: str, code: int = 400, responseHeaders: Any = None) -> None:
        if responseHeaders is None:
            responseHeaders = self.deny_headers
        super().failHandshake(reason, code, responseHeaders)  # type: ignore[misc]


class _PlainTimers:
    def __init__(self, reactor: Any) -> None:
        self._reactor = reactor

    def call_later(self, delay: float, func: Any, *args: Any, **kwargs: Any) -> Any:
        return self._reactor.callLater(delay, func, *args, **kwargs)


def plain_autobahn_timers(factory: Any, reactor: Any) -> None:
    """
    Autobahn batches its timers into buckets that stay on the reactor after
    the timers are cancelled, which trial reports as a dirty reactor; plain
    reactor calls are cancelled for real.  For tests and benchmarks.
    """
    factory._batched_timer = _PlainTimers(reactor)
