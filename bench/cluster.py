"""
Cluster mode's cost: request round trips through one gateway to a computer on
it, against through another gateway relayed by Redis (SPEC §13).

    .venv/bin/python -m bench.cluster [REQUESTS] [CONCURRENCY]

Starts its own redis-server and two ``twistd trapsandbox`` (refresh 5 s) on
127.0.0.1, one in-process computer connected to the first, then sends the
same ``ping`` requests over HTTP keep-alive to each gateway and prints
requests/s and p50/p99.  Then it counts the Redis commands idle computers
cost: the commands Redis ran in a window with no computers (heartbeats), and
in one with ``IDLE`` computers on the first gateway, the difference per
computer per minute.  Everything it started is stopped at the end.
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

# Every operator POST is JSON (SPEC §4: 415 otherwise).
JSON = {"Content-Type": "application/json"}
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


IDLE = 500
IDLE_WINDOW = 30.0


class _Computer(WebSocketClientProtocol):
    trapos_id = "1:bench"

    def onOpen(self) -> None:
        self.trapos_id = self.factory.trapos_id
        hello = {
            "event": "computer_request",
            "traposSenderId": self.trapos_id,
            "messageId": "hello",
            "type": "hello",
            "payload": {"traposId": self.trapos_id},
        }
        self.sendMessage(orjson.dumps(hello))

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        frame = orjson.loads(payload)
        if frame["event"] == "gateway_response":
            self.factory.ready.callback(self)
        elif frame["event"] == "gateway_request":
            answer = {
                "event": "computer_response",
                "traposSenderId": self.trapos_id,
                "messageId": frame["messageId"],
                "type": frame["type"],
                "ok": True,
                "payload": {"traposId": self.trapos_id},
            }
            self.sendMessage(orjson.dumps(answer))


async def _connect(reactor, port: int, trapos_id: str) -> _Computer:
    factory = WebSocketClientFactory(f"ws://127.0.0.1:{port}/gateway")
    factory.protocol = _Computer
    factory.trapos_id = trapos_id
    factory.ready = defer.Deferred()
    await endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", port).connect(factory)
    return await factory.ready


def _commands(redis_port: int) -> tuple[int, int]:
    """
    (calls the gateways made, commands Redis ran in all) so far, from INFO
    commandstats, the INFO itself left out: a script is one call, and the
    commands it runs count too.
    """
    out = subprocess.run(
        ["redis-cli", "-p", str(redis_port), "info", "commandstats"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    calls = {m[0]: int(m[1]) for m in re.findall(r"cmdstat_(\w+):calls=(\d+)", out)}
    # The gateways send scripts and PUBLISH only; the rest is what the scripts run.
    clients = sum(n for name, n in calls.items() if name in ("eval", "evalsha", "publish"))
    return clients, sum(n for name, n in calls.items() if name != "info")


async def _window(reactor, redis_port: int) -> tuple[int, int]:
    before = _commands(redis_port)
    await task.deferLater(reactor, IDLE_WINDOW, lambda: None)
    after = _commands(redis_port)
    return after[0] - before[0], after[1] - before[1]


async def _measure(reactor, url: str, requests: int, concurrency: int) -> dict[str, float]:
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = concurrency
    body = orjson.dumps({"type": "ping"})
    times: list[float] = []
    left = iter(range(requests))

    async def worker():
        for _ in left:
            started = time.perf_counter()
            response = await treq.post(url, data=body, headers=JSON, pool=pool)
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
        baseline = await _window(reactor, redis_port)
        computer = await _connect(reactor, gateways[0][1], "1:bench")
        for name, (_, port) in (("same process", gateways[0]), ("cross process", gateways[1])):
            url = f"http://127.0.0.1:{port}/computers/1%3Abench/requests"
            await _measure(reactor, url, 200, concurrency)  # warm up
            figures = await _measure(reactor, url, requests, concurrency)
            print(
                f"{name:14} {figures['rps']:8.0f} req/s  p50 {figures['p50_ms']:6.2f} ms"
                f"  p99 {figures['p99_ms']:6.2f} ms  ({requests} pings, {concurrency} at once)"
            )
        idle = [await _connect(reactor, gateways[0][1], f"{n}:idle") for n in range(2, IDLE + 2)]
        loaded = await _window(reactor, redis_port)
        scale = 60 / IDLE_WINDOW / (IDLE + 1)
        print(
            f"Redis, {IDLE_WINDOW:g} s windows, no computer (2 gateways' heartbeats) vs "
            f"{IDLE + 1} idle computers: calls {baseline[0]} vs {loaded[0]}, commands run "
            f"{baseline[1]} vs {loaded[1]}; per idle computer per minute: "
            f"{(loaded[0] - baseline[0]) * scale:.3f} calls, "
            f"{(loaded[1] - baseline[1]) * scale:.1f} commands (inside the batched scripts)"
        )
        for each in (computer, *idle):
            each.sendClose(1000)
    finally:
        for proc, _ in gateways:
            proc.terminate()
        redis.terminate()
        for proc in [*(p for p, _ in gateways), redis]:
            proc.wait(10)


if __name__ == "__main__":
    task.react(lambda reactor: defer.Deferred.fromCoroutine(main(reactor, *map(int, sys.argv[1:]))))
