"""
Cluster mode's cost: request round trips through one gateway to a computer on
it, against through another gateway relayed by Redis (SPEC §13).

    .venv/bin/python -m bench.cluster [REQUESTS] [CONCURRENCY]

Starts its own redis-server and two ``twistd trapsandbox`` (refresh 5 s) on
127.0.0.1, one in-process computer connected to the first, then sends the
same ``ping`` requests over HTTP keep-alive to each gateway and prints
requests/s and p50/p99.  Everything it started is stopped at the end.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import orjson
import treq
from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from twisted.internet import defer, endpoints, task
from twisted.web.client import HTTPConnectionPool

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TWISTD = os.path.join(os.path.dirname(sys.executable), "twistd")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(argv: list[str], env: dict[str, str], ready: str) -> tuple[subprocess.Popen, str]:
    # Output to a file, never an undrained pipe (a full pipe would stall the server).
    log = tempfile.NamedTemporaryFile(prefix="bench-cluster-", suffix=".log", delete=False)
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with open(log.name, encoding="utf-8", errors="replace") as f:
            seen = f.read()
        if re.search(ready, seen):
            return proc, seen
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"did not start: {argv[0]}\n{seen}")


class _Computer(WebSocketClientProtocol):
    def onOpen(self) -> None:
        hello = {
            "event": "computer_request",
            "traposSenderId": "1:bench",
            "messageId": "hello",
            "type": "hello",
            "payload": {"traposId": "1:bench"},
        }
        self.sendMessage(orjson.dumps(hello))

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        frame = orjson.loads(payload)
        if frame["event"] == "gateway_response":
            self.factory.ready.callback(self)
        elif frame["event"] == "gateway_request":
            answer = {
                "event": "computer_response",
                "traposSenderId": "1:bench",
                "messageId": frame["messageId"],
                "type": frame["type"],
                "ok": True,
                "payload": {"traposId": "1:bench"},
            }
            self.sendMessage(orjson.dumps(answer))


async def _measure(reactor, url: str, requests: int, concurrency: int) -> dict[str, float]:
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = concurrency
    body = orjson.dumps({"type": "ping"})
    times: list[float] = []
    left = iter(range(requests))

    async def worker():
        for _ in left:
            started = time.perf_counter()
            response = await treq.post(url, data=body, pool=pool)
            await treq.content(response)
            assert response.code == 200, response.code
            times.append(time.perf_counter() - started)

    started = time.perf_counter()
    await defer.gatherResults([defer.Deferred.fromCoroutine(worker()) for _ in range(concurrency)])
    elapsed = time.perf_counter() - started
    await pool.closeCachedConnections()
    times.sort()
    return {
        "rps": len(times) / elapsed,
        "p50_ms": times[len(times) // 2] * 1000,
        "p99_ms": times[int(len(times) * 0.99)] * 1000,
    }


async def main(reactor, requests: int = 5000, concurrency: int = 20) -> None:
    redis_port = _port()
    redis, _ = _start(
        [
            shutil.which("redis-server") or "redis-server",
            "--port",
            str(redis_port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        dict(os.environ),
        "Ready to accept connections",
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SANDBOX_", "OPENCODE_"))},
        "PYTHONPATH": REPO,
        "OPENCODE_URL": "",
        "SANDBOX_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
    }
    gateways = []
    try:
        for _ in range(2):
            proc, seen = _start(
                [TWISTD, "-n", "--pidfile=", "trapsandbox", "--port", "tcp:0:interface=127.0.0.1"],
                env,
                r"cluster: listening on",
            )
            port = int(re.search(r"listening on 127\.0\.0\.1:(\d+)", seen).group(1))
            gateways.append((proc, port))
        factory = WebSocketClientFactory(f"ws://127.0.0.1:{gateways[0][1]}/gateway")
        factory.protocol = _Computer
        factory.ready = defer.Deferred()
        await endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", gateways[0][1]).connect(factory)
        computer = await factory.ready
        for name, (_, port) in (("same process", gateways[0]), ("cross process", gateways[1])):
            url = f"http://127.0.0.1:{port}/computers/1%3Abench/requests"
            await _measure(reactor, url, 200, concurrency)  # warm up
            figures = await _measure(reactor, url, requests, concurrency)
            print(
                f"{name:14} {figures['rps']:8.0f} req/s  p50 {figures['p50_ms']:6.2f} ms"
                f"  p99 {figures['p99_ms']:6.2f} ms  ({requests} pings, {concurrency} at once)"
            )
        computer.sendClose(1000)
    finally:
        for proc, _ in gateways:
            proc.terminate()
        redis.terminate()
        for proc in [*(p for p, _ in gateways), redis]:
            proc.wait(10)


if __name__ == "__main__":
    task.react(lambda reactor: defer.Deferred.fromCoroutine(main(reactor, *map(int, sys.argv[1:]))))
