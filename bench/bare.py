"""
The ceiling: a bare Autobahn server that echoes every message, with no protocol.

It listens with the very ``GatewayFactory`` instance (so exactly the gateway's
Autobahn options: frame and message limits, auto-ping, timeouts) whose
protocol is swapped for an echo, straight on the TCP port (no twisted.web
Site, no Klein routing).  Same reactor as ``twistd`` on Linux (epoll)::

    python -m bench.bare --port tcp:0:interface=127.0.0.1

logs ``listening on 127.0.0.1:PORT`` like the gateway does.
"""

from __future__ import annotations

import argparse
import sys

from autobahn.twisted.websocket import WebSocketServerProtocol


class Echo(WebSocketServerProtocol):
    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.sendMessage(payload, isBinary)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bare", description=__doc__)
    parser.add_argument("--port", default="tcp:0:interface=127.0.0.1")
    args = parser.parse_args(argv)

    from twisted.internet import endpoints, reactor

    from trapsandbox import config
    from trapsandbox.tap import build

    factory = build(config.Settings(ports=(args.port,), opencode_url=""), reactor).factory
    factory.protocol = Echo

    def listening(port) -> None:
        host = port.getHost()
        print(f"listening on {host.host}:{host.port}", flush=True)

    def failed(failure) -> None:
        print(f"bench.bare: cannot listen: {failure.getErrorMessage()}", flush=True)
        reactor.stop()

    d = endpoints.serverFromString(reactor, args.port).listen(factory)
    d.addCallbacks(listening, failed)
    reactor.run()  # stops on SIGTERM
    sys.exit(0)


if __name__ == "__main__":
    main()
