"""
The port's two WebSocket protocols as fast mode serves them: the frame fast
path (``patches.WholeFrames``), Autobahn's per-connection attributes as slots
(``patches.protocol_slots``), and, for computers, the opening handshake let go
once it is over (``patches.release_handshake``).  Same behaviour as the plain
classes they extend (``computers.protocol.GatewayProtocol``,
``web.opsocket.OperatorSocket``), held to it by the suite running both modes.
"""

from __future__ import annotations

from autobahn.twisted.websocket import WebSocketServerProtocol

from trapsandbox.computers.protocol import GatewayProtocol
from trapsandbox.fast import patches
from trapsandbox.web.opsocket import OperatorSocket


class FastGatewayProtocol(patches.WholeFrames, GatewayProtocol):
    # Autobahn's attributes and ours as slots: 8 bytes each rather than a
    # 3.3 kB dict per computer (patches.protocol_slots).  A name missing here
    # (one GatewayProtocol adds later) only costs its dict entry.
    __slots__ = patches.protocol_slots(
        WebSocketServerProtocol,
        (
            "session",
            "peer_address",
            "peer_host",
            "outbound",
            "_hello_timer",
            "_busy",
            "_awaiting_hello",
            "_answering_close",
        ),
    )

    def onOpen(self) -> None:
        patches.release_handshake(self)
        super().onOpen()


class FastOperatorSocket(patches.WholeFrames, OperatorSocket):
    pass
