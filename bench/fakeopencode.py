"""
A tiny, fast fake opencode: ``GET /config`` answers 200 with a JSON body.

asyncio (uvloop when installed) with a hand-written HTTP/1.1 keep-alive
parser, so it costs the machine as little as possible.  It counts the
``/config`` requests; ``GET /_bench/count`` answers ``{"requests": N}``
without counting itself.  ``--delay-ms`` holds each answer that long (the
real opencode takes a millisecond or so).  Logs ``listening on HOST:PORT``::

    python -m bench.fakeopencode --port 0
"""

from __future__ import annotations

import argparse
import asyncio
import signal

CONFIG = b'{"$schema":"https://opencode.ai/config.json","share":"disabled"}'


def _response(status: bytes, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


CONFIG_RESPONSE = _response(b"200 OK", CONFIG)
NOT_FOUND = _response(b"404 Not Found", b'{"error":"not found"}')


class Server:
    def __init__(self, delay: float) -> None:
        self.requests = 0
        self.delay = delay


class Http(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.buffer = b""
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head, self.buffer = self.buffer[:end], self.buffer[end + 4 :]
            # GET requests carry no body; a body announced anyway is skipped.
            length = _content_length(head)
            if length:
                self.buffer = self.buffer[length:]
            self._answer(head.split(b" ", 2)[1] if b" " in head else b"")

    def _answer(self, path: bytes) -> None:
        path = path.split(b"?", 1)[0]
        if path == b"/config":
            self.server.requests += 1
            answer = CONFIG_RESPONSE
        elif path == b"/_bench/count":
            answer = _response(b"200 OK", b'{"requests":%d}' % self.server.requests)
        else:
            answer = NOT_FOUND
        if self.server.delay:
            asyncio.get_running_loop().call_later(self.server.delay, self._write, answer)
        else:
            self._write(answer)

    def _write(self, answer: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(answer)


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip() or 0)
    return 0


async def serve(host: str, port: int, delay: float) -> None:
    loop = asyncio.get_running_loop()
    server = Server(delay)
    listener = await loop.create_server(lambda: Http(server), host, port, backlog=1024)
    bound = listener.sockets[0].getsockname()
    print(f"listening on {bound[0]}:{bound[1]}", flush=True)
    stopped = loop.create_future()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, lambda: stopped.done() or stopped.set_result(None))
    await stopped
    listener.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fakeopencode", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    args = parser.parse_args(argv)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args.host, args.port, args.delay_ms / 1000))
    else:
        uvloop.run(serve(args.host, args.port, args.delay_ms / 1000))


if __name__ == "__main__":
    main()
