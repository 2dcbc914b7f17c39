"""
What the gateway answers when a computer asks: one handler per request type.

    computer_request probe_gateway | health  ->  {sandboxOk, opencodeOk, opencodeDetail?}
    computer_request capabilities {capabilities: [..]}  ->  {capabilities: [..]}
        what the computer's owner allows from now on (``sandbox allow``/``deny``)

A handler takes the computer's ``Session`` and its ``ComputerRequest`` and
returns the answer's payload, or a Deferred that fires with it; a
``GatewayError`` (raised or as a failure) is answered as that error, anything
else as ``internal``.  ``hello`` is not here: it is the connection's own
business (``trapsandbox.gateway``).  A new request type is one method here and
one entry in ``table``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from trapsandbox import wire
from trapsandbox.wire import GatewayError

if TYPE_CHECKING:
    from trapsandbox.probe import OpencodeProbe, ProbeResult
    from trapsandbox.registry import Session

log = Logger()

Handler = Callable[["Session", wire.ComputerRequest], "Deferred | dict[str, Any]"]


class ComputerRequests:
    """The handlers of one gateway, and the table the connections dispatch on."""

    def __init__(self, probe: OpencodeProbe) -> None:
        self._probe = probe

    def table(self) -> dict[str, Handler]:
        return {
            "probe_gateway": self.probe_gateway,
            # The first seed's name for it; the answer echoes the type asked.
            "health": self.probe_gateway,
            "capabilities": self.capabilities,
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
        session.capabilities = allowed
        return {"capabilities": sorted(allowed)}


def _payload_of(result: ProbeResult) -> dict[str, Any]:
    return result.payload
