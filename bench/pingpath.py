"""
The operator request's path in one process, without sockets: what the gateway's own
code costs a ``ping`` (``python -m bench --scenarios ping`` adds the kernel's sends and
receives and the reactor's loop around it).

    python -m bench.pingpath [--requests N] [--profile]

The fast paths installed as ``tap.makeService`` installs them; one computer on a
``FastGatewayProtocol`` past its hello, and 32 operator connections through the port's
first-bytes router (``FastHTTP``), each sending ``POST /computers/{id}/requests`` with
``{"type":"ping","timeoutMs":10000}`` and the admin's token, as the bench does.  A round
sends one request on each connection, answers the 32 frames the computer was sent, and
reads the 32 answers; the reactor's timed calls are run once a round.  Printed: CPU
microseconds a request (``time.process_time``), the best and the median of seven series
(the driver's own work, building each answer frame, included: ~1 us).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import re
import time
import types

import orjson
from twisted.internet import reactor
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport

from trapsandbox.admission.auth import Admission
from trapsandbox.admission.strangers import Strangers
from trapsandbox.computers.protocol import GatewayFactory
from trapsandbox.computers.registry import Registry
from trapsandbox.fast import paths
from trapsandbox.web.operator import OperatorRequests

TOKEN = "bench-admin-token-0123456789"
SECRET = "bench-secret-0123456789"
CONNECTIONS = 32
_MESSAGE_ID = re.compile(rb'"messageId":"([^"]+)"')
_ANSWER = (
    b'{"event":"computer_response","traposSenderId":"7:bench","messageId":"%s",'
    b'"type":"ping","ok":true,"payload":{"traposId":"7:bench"}}'
)


class _Transport(StringTransport):
    """Keeps each write apart, so that a round takes what it was sent."""

    def __init__(self, peer: IPv4Address) -> None:
        super().__init__(peerAddress=peer)
        self.out: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def unregisterProducer(self) -> None:
        self.producer = None


def _frame(payload: bytes) -> bytes:
    """A client's text frame, masked with a zero key (the payload as it is)."""
    n = len(payload)
    head = bytes([0x81, 0x80 | n]) if n <= 125 else bytes([0x81, 0xFE, n >> 8, n & 255])
    return head + b"\0\0\0\0" + payload


def _connect(factory, port: int) -> _Transport:
    transport = _Transport(IPv4Address("TCP", "127.0.0.1", port))
    protocol = factory.buildProtocol(transport.getPeer())
    transport.protocol = protocol
    protocol.makeConnection(transport)
    return transport


def build():
    """The gateway's parts and a round function; checks one exchange first."""
    fast = paths.install()
    registry = Registry(reactor, request_timeout=30)
    admission = Admission(reactor, password=SECRET, admin_token=TOKEN)
    requests = OperatorRequests(registry, admission)
    gateway = GatewayFactory(registry, admission, {}, reactor)
    fast.protocols(gateway, types.SimpleNamespace())
    front = fast.listener(None, gateway, reactor, requests, None, Strangers())

    computer = _connect(gateway, 40000)
    computer.protocol.dataReceived(
        b"GET /gateway?n=1 HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    hello = {"traposId": "7:bench", "secret": SECRET, "version": "bench"}
    computer.protocol.dataReceived(
        _frame(
            orjson.dumps(
                {
                    "event": "computer_request",
                    "traposSenderId": "7:bench",
                    "messageId": "hello-1",
                    "type": "hello",
                    "payload": hello,
                }
            )
        )
    )
    if b'"ok":true' not in b"".join(computer.out):
        raise SystemExit("the computer's hello was refused")
    computer.out.clear()

    body = b'{"type":"ping","timeoutMs":10000}'
    request = (
        b"POST /computers/7%%3Abench/requests HTTP/1.1\r\nHost: 127.0.0.1:1\r\n"
        b"Content-Type: application/json\r\nAuthorization: Bearer %s\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (TOKEN.encode(), len(body), body)
    )
    clients = [_connect(front, 50000 + i) for i in range(CONNECTIONS)]

    def one_round() -> list[bytes]:
        for client in clients:
            client.protocol.dataReceived(request)
        sent = computer.out[:]
        computer.out.clear()
        receive = computer.protocol.dataReceived
        for data in sent:
            receive(_frame(_ANSWER % _MESSAGE_ID.search(data).group(1)))
        reactor.runUntilCurrent()
        return [client.out.pop() for client in clients]

    for answer in one_round():
        if not answer.startswith(b"HTTP/1.1 200 ") or b'"ok":true' not in answer:
            raise SystemExit(f"not answered: {answer!r}")
    return one_round


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pingpath", description=__doc__)
    parser.add_argument("--requests", type=int, default=32_000)
    parser.add_argument("--profile", action="store_true", help="cProfile one series instead")
    args = parser.parse_args(argv)
    one_round = build()
    rounds = max(1, args.requests // CONNECTIONS)
    for _ in range(200):
        one_round()
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(rounds):
            one_round()
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(40)
        return
    series = []
    for _ in range(7):
        started = time.process_time()
        for _ in range(rounds):
            one_round()
        series.append((time.process_time() - started) / (rounds * CONNECTIONS) * 1e6)
    series.sort()
    print(
        f"CPU per request (us): best {series[0]:.2f}, median {series[3]:.2f} "
        f"(series: {', '.join(f'{s:.1f}' for s in series)})"
    )


if __name__ == "__main__":
    main()
