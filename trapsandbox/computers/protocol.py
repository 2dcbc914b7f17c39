"""
The WebSocket side: one ``GatewayProtocol`` per computer connection.

    computer                                gateway
    computer_request hello {traposId, secret, version?, capabilities?, features?, stopped?,
                            stopMessage?}      ->
                                               <- gateway_response hello ok {accountId}
                                                  (or ok:false unauthorized, then close 4001)
    computer_request probe_gateway|health      ->
                                               <- gateway_response ok {sandboxOk, opencodeOk,
                                                                       opencodeDetail?}
                                               <- gateway_request ping (from the registry)
    computer_response ping ok {traposId}       ->

Before a successful hello every request is answered ``not_authenticated``;
without one within ``hello_timeout`` the connection is closed with 4002.  A
hello's secret is always checked (``auth.Admission.computer``): the right
one is admitted; a wrong one from an address that keeps failing is refused
for a while (``overloaded``, close 4003).  An address with too many
connections waiting for hello is refused the upgrade (429), and a computer
past its account's ``max_computers`` its hello (SPEC §12).  A computer's
address is the one ``auth.Admission.client_address`` gives (a trusted
reverse proxy's client).
Bad frames are ignored (logged, rate-limited) and never end the connection.
Nothing raised while handling a message escapes ``onMessage``: Autobahn
would drop the TCP connection without a close frame.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.protocol import WebSocketProtocol
from autobahn.websocket.types import ConnectionDeny
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox import errors, limits
from trapsandbox.admission import auth, proxies
from trapsandbox.compat import fixes
from trapsandbox.computers import parts, wire
from trapsandbox.computers.lines import Throttle, computer_lines
from trapsandbox.computers.outbound import Outbound
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.sending import Sending
from trapsandbox.computers.session import Session
from trapsandbox.errors import GatewayError
from trapsandbox.ops.metrics import Metrics

log = Logger()

# What answers one type of a computer's requests (``trapsandbox.handlers``): its payload, or a
# Deferred of it.
Handler = Callable[[Session, wire.ComputerRequest], "Deferred | dict[str, Any]"]


class GatewayProtocol(Sending, WebSocketServerProtocol):
    # (Fast mode serves ``trapsandbox.fast.protocols.FastGatewayProtocol``.)
    factory: GatewayFactory

    def __init__(self) -> None:
        super().__init__()
        # onClose runs even for connections that never opened: all state here.
        self.session: Session | None = None
        self.peer_address = "?"
        self.peer_host = "?"
        self.outbound: Outbound | None = None
        self._hello_timer = None
        self._busy = 0
        self._awaiting_hello = False
        self._answering_close = False

    # Autobahn callbacks

    def onConnect(self, request) -> None:
        factory = self.factory
        headers = request.headers
        if auth.foreign_upgrade(headers.get("origin"), headers.get("host")):
            # A web page must not connect as (and replace) a computer, auth or not.
            raise ConnectionDeny(403, "connections from web pages of other origins are refused")
        # Behind a trusted reverse proxy, the computer it forwards (SPEC §4).
        peer = factory.admission.client_address(
            self.transport.getPeer(), headers.get("x-forwarded-for"), headers.get("forwarded")
        )
        self.peer_address = proxies.describe(peer)
        self.peer_host = auth.host_of(peer)
        waiting = factory.awaiting_hello.get(self.peer_host, 0)
        if waiting >= factory.max_unauthenticated_per_address:
            suppressed = factory.refused_log.allow()
            if suppressed is not None:
                log.warn(
                    "refused a connection from {host}: {waiting} of its connections await "
                    "hello ({suppressed} more refusals not logged)",
                    host=self.peer_host,
                    waiting=waiting,
                    suppressed=suppressed,
                )
            raise ConnectionDeny(429, "too many connections from your address await hello")
        factory.awaiting_hello[self.peer_host] = waiting + 1
        self._awaiting_hello = True

    def onOpen(self) -> None:
        self.factory.connections.add(self)
        self.start_sending()
        self._hello_timer = self.factory.clock.callLater(
            self.factory.hello_timeout, self._hello_timed_out
        )

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        try:
            self._receive(payload, isBinary)
        except Exception:
            log.failure("unexpected error handling a message from {peer}", peer=self.peer_address)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self._cancel_hello_timer()
        fixes.cancel_close_handshake_timer(self)
        self._hello_done()
        if self.outbound is not None:
            self.outbound.stopProducing()
        self.factory.connections.discard(self)
        if self.session is not None:
            self.factory.registry.remove(self.session)
        if self.session is not None and self.factory.disconnect_lines.allow():
            log.info(
                "{traposId} from {peer} disconnected ({code} {reason})",
                traposId=self.session.trapos_id,
                peer=self.peer_address,
                code=code,
                reason=reason or "",
            )
        self.factory.check_drained()

    def onCloseFrame(self, code: int | None, reasonRaw: bytes | None) -> bool | None:
        # Open: this close starts the handshake.  Failed by us: our answer to
        # the peer's bad frame may still be unsent.
        self._answering_close = self.state == WebSocketProtocol.STATE_OPEN or fixes.failed_by_us(
            self
        )
        try:
            return super().onCloseFrame(code, reasonRaw)
        finally:
            self._answering_close = False

    def dropConnection(self, abort: bool = False) -> None:
        # Autobahn answers a malformed close frame (a reserved code, a one-byte
        # body, a reason that is not UTF-8) with its own 1002/1007 close, then
        # aborts the connection, which throws that frame away unsent.  The peer
        # is reading (it just sent a close): let the frame go out first.
        if self._answering_close:
            abort = False
        super().dropConnection(abort)

    # The registry's Link

    def send_frame(self, data: bytes) -> None:
        # The registry sends only gateway_requests through its Link.
        self._send(data)
        self.factory.metrics.gateway_request_sent()

    def send_partial(self, message_id: str, type: str, payload: dict[str, Any]) -> None:
        # A streaming handler's interim answer (SPEC §2); the final one goes through _reply.
        receiver = self.session.trapos_id if self.session else "?"
        data = wire.encode_response(receiver, message_id, type, payload, partial=True)
        if len(data) > limits.MAX_OUTBOUND_BYTES:
            raise GatewayError(
                errors.TOO_LARGE, "a partial answer is larger than a computer accepts"
            )
        self._send(data)
        self.factory.metrics.gateway_response_sent()

    def _send(self, data: bytes) -> None:
        if self.state != WebSocketProtocol.STATE_OPEN:
            raise GatewayError(errors.NOT_CONNECTED, "the connection is closing")
        self.outbound.send(data)

    # Messages

    def _receive(self, payload: bytes, is_binary: bool) -> None:
        metrics = self.factory.metrics
        if is_binary:
            # File parts, from a client that announced them (``computers.parts``).
            if self.session is None or wire.BINARY_PARTS not in self.session.features:
                metrics.frame_received(bytes)
                self._ignore("a binary frame")
                return
            frame = parts.decode_response(payload)
            if type(frame) is wire.ComputerResponse and not self.session.asked_binary(
                frame.message_id
            ):
                frame = wire.Invalid(
                    "a binary message answering a request that did not ask for one",
                    event="computer_response",
                    message_id=frame.message_id,
                    type=frame.type,
                )
        else:
            frame = wire.decode(payload)
        kind = type(frame)
        metrics.frame_received(kind)
        if kind is wire.ComputerRequest:
            self._on_request(frame)
        elif kind is wire.ComputerResponse:
            self._on_response(frame)
        elif kind is wire.Invalid:
            self._on_invalid(frame)
        else:
            self._ignore(f"a {wire.event_name(frame)}, which a computer must not send")

    def _on_invalid(self, frame: wire.Invalid) -> None:
        if frame.event == "computer_request" and frame.answerable:
            self._reply_error(frame, errors.BAD_REQUEST, frame.reason)
        elif frame.event == "computer_response" and frame.message_id and self.session:
            # Its requester learns now rather than at its timeout.
            self.session.reject(
                frame.message_id,
                GatewayError(errors.BAD_REQUEST, f"the computer's answer was {frame.reason}"),
            )
        else:
            self._ignore(frame.reason)

    def _on_response(self, frame: wire.ComputerResponse) -> None:
        if self.session is None or not self.session.resolve(frame):
            self._ignore(f"a response to no request of this connection ({frame.message_id})")

    def _on_request(self, frame: wire.ComputerRequest) -> None:
        if frame.type == "hello":
            self._on_hello(frame)
            return
        if self.session is None:
            self._reply_error(frame, errors.NOT_AUTHENTICATED, "send hello first")
            return
        handler = self.factory.handlers.get(frame.type)
        if handler is None:
            self._reply_error(frame, errors.UNKNOWN_TYPE, f"unknown request type {frame.type!r}")
            return
        if self._busy >= self.factory.max_busy:
            self._reply_error(
                frame, errors.OVERLOADED, f"at most {self.factory.max_busy} requests at once"
            )
            return
        self._busy += 1
        try:
            result = handler(self.session, frame)
        except Exception:
            result = Failure()
        if isinstance(result, Deferred):
            result.addBoth(self._handled, frame)
        else:
            self._handled(result, frame)

    def _handled(self, result: dict[str, Any] | Failure, frame: wire.ComputerRequest) -> None:
        self._busy -= 1
        if not isinstance(result, Failure):
            self._reply(frame.message_id, frame.type, payload=result)
        elif result.check(GatewayError):
            self._reply(frame.message_id, frame.type, error=result.value)
        else:
            log.failure(
                "{type} request from {peer} failed", result, type=frame.type, peer=self.peer_address
            )
            self._reply_error(frame, errors.INTERNAL, "the gateway failed to handle this request")

    def _on_hello(self, frame: wire.ComputerRequest) -> None:
        if self.session is not None:
            self._reply_error(
                frame, errors.BAD_REQUEST, "hello was already completed on this connection"
            )
            return
        try:
            hello = wire.decode_hello(frame.payload)
        except ValueError as error:
            self.factory.metrics.hello(errors.BAD_REQUEST)
            self._reply_error(frame, errors.BAD_REQUEST, str(error))
            return
        admission = self.factory.admission
        admitted = admission.computer(
            self.peer_host, hello.secret, f"{self.peer_address} as {hello.trapos_id}"
        )
        if isinstance(admitted, auth.Admitted):
            refusal = admission.room(admitted.account, hello.trapos_id, self.factory.registry)
        else:
            refusal = admitted
        if refusal is not None:
            self._refuse_hello(frame, hello, refusal)
            return
        self._cancel_hello_timer()
        self._hello_done()
        self.factory.metrics.hello("ok")
        account_id = admitted.account
        self.session = Session(
            account_id=account_id,
            trapos_id=hello.trapos_id,
            link=self,
            clock=self.factory.clock,
            peer=self.peer_address,
            version=hello.version,
            connected_at=self.factory.clock.seconds(),
            capabilities=wire.decode_capabilities(hello.capabilities),
            features=wire.FEATURES & frozenset(hello.features),
            stopped=wire.stop_message(hello.trapos_id, hello.stopped, hello.stop_message),
            credential=admitted.credential,
        )
        self.factory.registry.add(self.session)
        if self.factory.connect_lines.allow():
            log.info(
                "{traposId} connected from {peer} (client {version})",
                traposId=hello.trapos_id,
                peer=self.peer_address,
                version=hello.version or "unknown",
            )
        answer = {"accountId": account_id}
        findable = self.factory.registry.findable(self.session)
        if findable is None:
            self._reply(frame.message_id, frame.type, payload=answer)
        else:  # cluster mode: answered once every process finds it (SPEC §13)
            findable.addCallback(lambda _: self._reply(frame.message_id, frame.type, answer))

    def _refuse_hello(
        self, frame: wire.ComputerRequest, hello: wire.Hello, refusal: auth.Refusal
    ) -> None:
        code, message, close_code, close_reason = _hello_refusal(refusal)
        self.factory.metrics.hello(code)
        log.debug(
            "refused hello from {peer}: {code}, traposId {traposId}, client {version}, "
            "allows {capabilities}",
            peer=self.peer_address,
            code=code,
            traposId=hello.trapos_id,
            version=hello.version,
            capabilities=hello.capabilities,
        )
        self._reply_error(frame, code, message, receiver=hello.trapos_id)
        self._cancel_hello_timer()
        self.close(close_code, close_reason)

    def _reply_error(
        self, frame: wire.ComputerRequest | wire.Invalid, code: str, message: str, **kwargs: Any
    ) -> None:
        self._reply(frame.message_id, frame.type, error=GatewayError(code, message), **kwargs)

    def _reply(
        self,
        message_id: str,
        type: str,
        payload: dict[str, Any] | None = None,
        error: GatewayError | None = None,
        receiver: str | None = None,
    ) -> None:
        if receiver is None:
            receiver = self.session.trapos_id if self.session else "?"
        outcome = "ok" if error is None else error.code
        wire_error = error.to_wire() if error else None
        try:
            data = wire.encode_response(receiver, message_id, type, payload, wire_error)
        except wire.EncodeError:
            log.failure("cannot encode the answer to {type}", type=type)
            data, outcome, reason = None, errors.INTERNAL, "the answer could not be encoded"
        if data is not None and len(data) > limits.MAX_OUTBOUND_BYTES:
            data, outcome, reason = (
                None,
                errors.TOO_LARGE,
                "the answer is larger than a computer accepts",
            )
        if data is None:
            data = wire.encode_response(
                receiver, message_id, type, error=errors.Error(outcome, reason)
            )
        metrics = self.factory.metrics
        metrics.computer_request(type, outcome)
        try:
            self._send(data)
            metrics.gateway_response_sent()
        except GatewayError:
            log.debug("answer to {type} dropped: {peer} is gone", type=type, peer=self.peer_address)

    def _ignore(self, what: str) -> None:
        suppressed = self.factory.ignored_log.allow()
        if suppressed is not None:
            log.info(
                "ignored {what} from {peer} ({suppressed} more ignored frames not logged)",
                what=what,
                peer=self.peer_address,
                suppressed=suppressed,
            )

    def _cancel_hello_timer(self) -> None:
        if self._hello_timer is not None and self._hello_timer.active():
            self._hello_timer.cancel()
        self._hello_timer = None

    def _hello_done(self) -> None:
        """This connection no longer counts as awaiting hello."""
        if self._awaiting_hello:
            self._awaiting_hello = False
            awaiting = self.factory.awaiting_hello
            left = awaiting[self.peer_host] - 1
            if left:
                awaiting[self.peer_host] = left
            else:
                del awaiting[self.peer_host]

    def who(self) -> str:
        return self.session.trapos_id if self.session else self.peer_address

    def _hello_timed_out(self) -> None:
        self._hello_timer = None
        log.info(
            "{peer} sent no hello within {timeout:g} s",
            peer=self.peer_address,
            timeout=self.factory.hello_timeout,
        )
        self.close(wire.CLOSE_HELLO_TIMEOUT, "hello timeout")


def _hello_refusal(refusal: auth.Refusal) -> tuple[str, str, int, str]:
    """How a refused hello is told: its error code and message, the close code and reason."""
    if refusal.reason == auth.THROTTLED:
        return (
            errors.OVERLOADED,
            f"too many failed hellos from your address: try again in {refusal.wait:.0f} s",
            wire.CLOSE_THROTTLED,
            "too many failed hellos",
        )
    if refusal.reason == auth.FULL:
        return (
            errors.OVERLOADED,
            refusal.message,
            wire.CLOSE_TOO_MANY_COMPUTERS,
            "too many computers",
        )
    return errors.UNAUTHORIZED, refusal.message, wire.CLOSE_UNAUTHORIZED, "unauthorized"


def server_options(
    max_bytes: int, auto_ping_interval: float, auto_ping_timeout: float
) -> dict[str, Any]:
    """
    The Autobahn options of the port's WebSockets, to give in one
    ``setProtocolOptions`` call (a later call without ``allowNullOrigin``
    would reset it).
    """
    return {
        "maxFramePayloadSize": max_bytes,
        "maxMessagePayloadSize": max_bytes,
        # Oversized messages get a real 1009 close frame, not a dropped socket.
        "failByDrop": False,
        "autoPingInterval": auto_ping_interval,
        "autoPingTimeout": auto_ping_timeout,
        "openHandshakeTimeout": limits.OPEN_HANDSHAKE_TIMEOUT,
        "closeHandshakeTimeout": limits.CLOSE_HANDSHAKE_TIMEOUT,
        "allowNullOrigin": True,
        # A plain GET gets an error, not an HTML status page.
        "webStatus": False,
    }


class GatewayFactory(WebSocketServerFactory):
    """Shared state of all computer connections."""

    protocol = GatewayProtocol

    def __init__(
        self,
        registry: Registry,
        admission: auth.Admission,
        handlers: dict[str, Handler],
        clock: IReactorTime,
        hello_timeout: float = limits.HELLO_TIMEOUT,
        max_busy: int = limits.MAX_BUSY,
        auto_ping_interval: float = limits.AUTO_PING_INTERVAL,
        auto_ping_timeout: float = limits.AUTO_PING_TIMEOUT,
        metrics: Metrics | None = None,
        max_connections: int = limits.MAX_CONNECTIONS,
        max_unauthenticated_per_address: int = limits.MAX_UNAUTHENTICATED_PER_ADDRESS,
        max_queued_bytes: int = limits.MAX_QUEUED_BYTES,
        stall_timeout: float = limits.STALL_TIMEOUT,
    ) -> None:
        super().__init__()
        self.registry = registry
        self.metrics = registry.metrics if metrics is None else metrics
        self.metrics.handle_types(handlers)
        self.metrics.frame_kinds(wire.FRAME_KINDS)
        self.admission = admission
        self.handlers = handlers
        self.clock = clock
        self.hello_timeout = hello_timeout
        self.max_busy = max_busy
        self.max_unauthenticated_per_address = max_unauthenticated_per_address
        self.max_queued_bytes = max_queued_bytes
        self.stall_timeout = stall_timeout
        self.connections: set[GatewayProtocol] = set()
        self.awaiting_hello: dict[str, int] = {}
        self.ignored_log = Throttle(clock, limits.LOG_INTERVAL)
        self.refused_log = Throttle(clock, limits.LOG_INTERVAL)
        self.connect_lines = computer_lines(clock, "connected")
        self.disconnect_lines = computer_lines(clock, "disconnected")
        self._drained: list[Deferred] = []
        self.setProtocolOptions(
            **server_options(limits.MAX_INBOUND_BYTES, auto_ping_interval, auto_ping_timeout),
            # Past this, the upgrade is refused with a 503.
            maxConnections=max_connections,
        )

    def revoke(self, admission: auth.Admission) -> int:
        """
        Close (4001) the computers whose account is gone, or whose account's secret
        changed, after the accounts file was read again; how many.
        """
        revoked = admission.revoked(self.registry)
        for session in revoked:
            # Unreachable at once, before its close handshake ends.
            self.registry.remove(session)
            session.link.close(wire.CLOSE_UNAUTHORIZED, "unauthorized")
        return len(revoked)

    def shutdown(self, grace: float = limits.SHUTDOWN_GRACE) -> Deferred:
        """
        Close every connection with 1000 and fail every pending request;
        fires when all are closed, or after ``grace`` seconds (the stragglers
        are then dropped).
        """
        for session in self.registry:
            session.fail_all(GatewayError(errors.NOT_CONNECTED, "the gateway is shutting down"))
        for connection in list(self.connections):
            connection.close(wire.CLOSE_NORMAL, "server shutting down")
        if not self.connections:
            self._flush_lines()
            return succeed(None)
        d = Deferred()
        self._drained.append(d)
        d.addTimeout(grace, self.clock)
        d.addErrback(lambda _: self._drop_stragglers(grace))
        return d

    def _drop_stragglers(self, grace: float) -> None:
        for connection in list(self.connections):
            # What Autobahn's warning of the drop says (else "None").
            connection.wasNotCleanReason = (
                f"it did not answer the gateway's close within {grace:g} s of its shutdown"
            )
            connection.dropConnection(abort=True)
        self._flush_lines()

    def _flush_lines(self) -> None:
        self.connect_lines.flush()
        self.disconnect_lines.flush()

    def check_drained(self) -> None:
        if not self.connections:
            self._flush_lines()
            drained, self._drained = self._drained, []
            for d in drained:
                d.callback(None)
