"""
What the gateway answers when a computer asks: one handler per request type.

    computer_request probe_gateway | health  ->  {sandboxOk, opencodeOk, opencodeDetail?}

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

from trapsandbox import wire

if TYPE_CHECKING:
    from trapsandbox.probe import OpencodeProbe, ProbeResult
    from trapsandbox.registry import Session

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
        }

    def probe_gateway(self, session: Session, frame: wire.ComputerRequest) -> Deferred | dict:
        result = self._probe.fresh()
        if result is not None:
            return result.payload  # answered at once: no Deferred on the hot path
        return self._probe.check().addCallback(_payload_of)


def _payload_of(result: ProbeResult) -> dict[str, Any]:
    return result.payload
