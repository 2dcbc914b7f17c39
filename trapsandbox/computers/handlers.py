"""
What the gateway answers when a computer asks: one handler per request type.

    computer_request probe_gateway | health  ->  {sandboxOk, opencodeOk, opencodeDetail?}
    computer_request capabilities {capabilities: [..]}  ->  {capabilities: [..]}
        what the computer's owner allows from now on (``sandbox allow``/``deny``)
    computer_request ask {prompt, new?, yes?}  ->  partials {type: text_delta | tool |
        permission | question, ..}, then {sessionId, text}
        (SPEC §11, ``trapsandbox.opencode.asks``)
    computer_request cancel {messageId}  ->  {cancelled: bool}: abort that ask
    computer_request ask_permission {permissionId, response: once|always|reject}  ->  {}
    computer_request ask_answer {questionId, answers: [[label, ..], ..] | reject: true}  ->  {}
        the player's answer to the agent's question (SPEC §17)

A handler takes the computer's ``Session`` and its ``ComputerRequest`` and
returns the answer's payload, or a Deferred that fires with it; a
``GatewayError`` (raised or as a failure) is answered as that error, anything
else as ``internal``.  A streaming handler sends partial responses first,
through ``session.link.send_partial(messageId, type, payload)``.  ``hello``
is not here: it is the connection's own business (``trapsandbox.computers.protocol``).
A new request type is one method here and one entry in ``table``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from trapsandbox.computers import wire
from trapsandbox.computers.wire import GatewayError

if TYPE_CHECKING:
    from trapsandbox.computers.registry import Session
    from trapsandbox.opencode.asks import Asks
    from trapsandbox.opencode.probe import OpencodeProbe, ProbeResult

log = Logger()

Handler = Callable[["Session", wire.ComputerRequest], "Deferred | dict[str, Any]"]


class ComputerRequests:
    """The handlers of one gateway, and the table the connections dispatch on."""

    def __init__(self, probe: OpencodeProbe, asks: Asks | None = None) -> None:
        self._probe = probe
        self._asks = asks

    def table(self) -> dict[str, Handler]:
        return {
            "probe_gateway": self.probe_gateway,
            # The first seed's name for it; the answer echoes the type asked.
            "health": self.probe_gateway,
            "capabilities": self.capabilities,
            "ask": self.ask,
            "cancel": self.cancel,
            "ask_permission": self.ask_permission,
            "ask_answer": self.ask_answer,
        }

    def probe_gateway(self, session: Session, frame: wire.ComputerRequest) -> Deferred | dict:
        result = self._probe.fresh()
        if result is not None:
            return result.payload  # answered at once: no Deferred on the hot path
        return self._probe.check().addCallback(_payload_of)

    def capabilities(self, session: Session, frame: wire.ComputerRequest) -> dict[str, Any]:
        try:
            allowed = wire.decode_capabilities(frame.payload.get("capabilities", []))
        except TypeError:
            raise GatewayError(wire.BAD_REQUEST, "capabilities must be a list of strings") from None
        if allowed != session.capabilities:
            log.info(
                "{traposId} now allows: {capabilities}",
                traposId=session.trapos_id,
                capabilities=", ".join(sorted(allowed)) or "nothing",
            )
        session.allow(allowed)
        return {"capabilities": sorted(allowed)}

    def _need_asks(self) -> Asks:
        if self._asks is None:
            raise GatewayError(wire.OPENCODE_ERROR, "this gateway does not talk to opencode")
        return self._asks

    def ask(self, session: Session, frame: wire.ComputerRequest) -> Deferred:
        asks = self._need_asks()

        def emit(payload: dict[str, Any]) -> None:
            session.link.send_partial(frame.message_id, frame.type, payload)

        return Deferred.fromCoroutine(
            asks.ask(
                session.account_id,
                session.trapos_id,
                session.capabilities,
                frame.message_id,
                frame.payload,
                emit,
            )
        )

    def cancel(self, session: Session, frame: wire.ComputerRequest) -> Deferred | dict[str, Any]:
        d = self._need_asks().cancel(
            session.account_id, session.trapos_id, frame.payload.get("messageId")
        )
        if d is None:
            return {"cancelled": False}
        return d.addCallback(lambda _: {"cancelled": True})

    def ask_permission(self, session: Session, frame: wire.ComputerRequest) -> Deferred:
        d = self._need_asks().reply(
            session.account_id,
            session.trapos_id,
            frame.payload.get("permissionId"),
            frame.payload.get("response"),
        )
        return d.addCallback(lambda _: {})

    def ask_answer(self, session: Session, frame: wire.ComputerRequest) -> Deferred:
        d = self._need_asks().answer(
            session.account_id,
            session.trapos_id,
            frame.payload.get("questionId"),
            frame.payload.get("answers"),
            frame.payload.get("reject"),
        )
        return d.addCallback(lambda _: {})


def _payload_of(result: ProbeResult) -> dict[str, Any]:
    return result.payload
