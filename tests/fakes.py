"""Fakes for unit tests."""

import attrs
import orjson

from trapsandbox import wire
from trapsandbox.registry import GatewayError


@attrs.define
class FakeLink:
    """A connection that records what is sent and closed."""

    sent: list = attrs.field(factory=list)
    closed: list = attrs.field(factory=list)
    open: bool = True

    def send_frame(self, data: bytes) -> None:
        if not self.open:
            raise GatewayError(wire.NOT_CONNECTED, "closed")
        self.sent.append(orjson.loads(data))

    def close(self, code: int, reason: str) -> None:
        self.closed.append((code, reason))
        self.open = False
