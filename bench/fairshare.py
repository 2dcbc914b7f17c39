"""
What one hostile account costs the gateway (issue 35, docs/security.md): the
gateway's CPU per computer change with 1 and with 4,096 ``watch_computers``,
and per hostile screen frame.

    python -m bench.fairshare [--computers 50] [--changes 20] [--frames 3000] [--idle 5]
                              [--output FILE]

A real ``twistd`` gateway (127.0.0.1:0, an accounts file of two accounts) and
Autobahn clients in this process.  Alice has ``--computers`` computers
connected, then:

- **changes**: one more computer of hers connects and leaves, ``--changes``
  times, each change waited for where a watcher hears it (so no two are
  coalesced); the gateway's CPU (``/proc``) over them, per change.  First
  with one ``watch_computers``; then with the issue's 4,096 asked: 16
  ``/operator`` sockets (her account's bound) sending 256 each (the bound of
  requests in flight on one socket).  Since issue 35 a socket holds one (the
  rest are refused), so 16 are held; before it, all 4,096 were.  The sockets
  beyond the first stop reading once set up, as an attacker's would.
- **hostile frames**: her computer answers her ``screen_watch`` with
  ``--frames`` compact frames of a 512x512 screen, every row ``{}`` (5.8 KB
  each), as fast as it can; then the same count of frames of CraftOS's
  largest monitor (164x81), which are relayed.  The gateway's CPU over them,
  per frame, and how many frames her watcher got.

Each figure has the gateway's idle CPU (its own timers, measured over
``--idle`` seconds first) taken out, as the spans differ: since issue 35 a
change is listed after a 50 ms debounce.  Run it on the code before a change
and after it to compare (the figures of docs/benchmarks.md, "One account's
load").
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import orjson
from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol, connectWS
from twisted.internet import defer, task
from twisted.internet.defer import Deferred

from bench import harness, proc
from bench.live import Operator, _listening, bounded, encode_frame
from trapsandbox.admission import accounts

SOCKETS = 16  # limits.MAX_OPERATOR_SOCKETS_PER_ACCOUNT
PER_SOCKET = 256  # limits.MAX_OPERATOR_IN_FLIGHT
WAIT = 60.0


class Computer(WebSocketClientProtocol):
    """A computer of ``factory.secret``'s account: hello, then what the gateway asks, queued."""

    def onOpen(self) -> None:
        self.requests: defer.DeferredQueue = defer.DeferredQueue()
        self.closed: Deferred = Deferred()
        self.send_frame(
            "computer_request",
            "hello-1",
            "hello",
            {
                "traposId": self.factory.trapos_id,
                "secret": self.factory.secret,
                "capabilities": ["screen"],
            },
        )

    def send_frame(self, event: str, message_id: str, type: str, payload: dict, **more) -> None:
        self.sendMessage(self.encode(event, message_id, type, payload, **more))

    def encode(self, event: str, message_id: str, type: str, payload: dict, **more) -> bytes:
        return encode_frame(self.factory.trapos_id, event, message_id, type, payload, **more)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        frame = orjson.loads(payload)
        if frame.get("event") == "gateway_response":
            if frame.get("type") == "hello" and not self.factory.ready.called:
                if frame.get("ok"):
                    self.factory.ready.callback(self)
                else:
                    self.factory.ready.errback(RuntimeError(f"hello refused: {frame}"))
            elif frame.get("messageId") == "probe":
                self.factory.probed.callback(None)
            return
        if frame.get("event") == "gateway_request":
            if frame["type"] == "ping":
                self.send_frame("computer_response", frame["messageId"], "ping", {}, ok=True)
            else:
                self.requests.put(frame)

    def onClose(self, wasClean, code, reason) -> None:
        if not self.factory.ready.called:
            self.factory.ready.errback(ConnectionError(f"closed: {code} {reason}"))
        self.closed.callback(None)

    def probe(self) -> Deferred:
        """Fires once the gateway answered a request sent after everything before it."""
        self.factory.probed = Deferred()
        self.send_frame("computer_request", "probe", "probe_gateway", {})
        return self.factory.probed


def connect_computer(port: int, trapos_id: str, secret: str) -> Deferred:
    factory = WebSocketClientFactory(f"ws://127.0.0.1:{port}/gateway?b={trapos_id}")
    factory.protocol = Computer
    factory.trapos_id = trapos_id
    factory.secret = secret
    factory.ready = Deferred()
    connectWS(factory)
    return factory.ready


def connect_operator(port: int, token: str) -> Deferred:
    factory = WebSocketClientFactory(
        f"ws://127.0.0.1:{port}/operator", headers={"Authorization": f"Bearer {token}"}
    )
    factory.protocol = Operator
    factory.opened = Deferred()
    connectWS(factory)
    return factory.opened


class Listings:
    """A socket's ``watch_computers`` partials, waited on by how many computers they list."""

    def __init__(self) -> None:
        self.waiting: tuple[int, Deferred] | None = None
        self.accepted: set[Any] = set()

    def heard(self, message_id: Any, payload: dict[str, Any]) -> None:
        self.accepted.add(message_id)
        if self.waiting is not None and len(payload["computers"]) == self.waiting[0]:
            if message_id == max(self.accepted):  # the socket's last watch heard it too
                d = self.waiting[1]
                self.waiting = None
                d.callback(None)

    def until(self, count: int, reactor) -> Deferred:
        d: Deferred = Deferred()
        self.waiting = (count, d)
        return bounded(d, reactor, WAIT)


async def changes(reactor, port: int, computers: int, count: int, watches: int) -> dict:
    """CPU per change with one socket's watch (``watches`` 1) or 16 sockets x 256."""
    sockets = [await bounded(connect_operator(port, "token-alice"), reactor)]
    if watches > 1:
        sockets += [
            await bounded(connect_operator(port, "token-alice"), reactor)
            for _ in range(SOCKETS - 1)
        ]
    per_socket = 1 if watches == 1 else PER_SOCKET
    listings = Listings()
    first = sockets[0]
    for n in range(per_socket):
        first.listeners[n] = lambda payload, size, n=n: listings.heard(n, payload)
    answered = []
    for socket in sockets:
        done: Deferred = Deferred()
        last = per_socket - 1
        socket.listeners[last] = (
            (lambda p, s, d=done, n=last: (listings.heard(n, p), d.called or d.callback(None)))
            if socket is first
            else (lambda p, s, d=done: d.called or d.callback(None))
        )
        socket.answers[last] = done  # refused (after the fix) or listed: either way, heard
        for n in range(per_socket):
            socket.sendMessage(orjson.dumps({"id": n, "type": "watch_computers"}))
        answered.append(done)
    await bounded(defer.gatherResults(answered), reactor, WAIT)
    for socket in sockets[1:]:
        socket.transport.pauseProducing()  # an attacker does not read
    pid = reactor.gateway_pid
    cpu0 = proc.cpu_seconds(pid)
    started = time.monotonic()
    for _ in range(count):
        # (Waited for from before the change: the listing may come before the change's answer.)
        listed = listings.until(computers + 1, reactor)
        comer = await bounded(connect_computer(port, "99:alice", "s-alice"), reactor)
        await listed
        listed = listings.until(computers, reactor)
        comer.sendClose(1000)
        await bounded(comer.closed, reactor)
        await listed
    wall = time.monotonic() - started
    cpu = proc.cpu_seconds(pid) - cpu0 - reactor.idle_cpu * wall
    for socket in sockets:
        socket.transport.resumeProducing()
        socket.sendClose(1000)
    return {
        "watches_asked": len(sockets) * per_socket,
        "changes": 2 * count,
        "seconds": round(wall, 2),
        "gateway_cpu_ms_per_change": round(cpu / (2 * count) * 1000, 2),
    }


async def frames(reactor, port: int, count: int, side: tuple[int, int]) -> dict:
    """CPU per frame of a computer answering its screen watch with ``count`` frames."""
    width, height = side
    trapos_id = f"{width}:evil{height}"
    evil = await bounded(connect_computer(port, trapos_id, "s-alice"), reactor)
    alice = await bounded(connect_operator(port, "token-alice"), reactor)
    got = [0]
    alice.listeners["s"] = lambda payload, size: got.__setitem__(0, got[0] + 1)
    ended: Deferred = alice.answers.setdefault("s", Deferred())
    alice.sendMessage(
        orjson.dumps({"id": "s", "traposId": trapos_id, "type": "screen_watch", "payload": {}})
    )
    watch = await bounded(evil.requests.get(), reactor)
    compact = {
        "type": "screen",
        "width": width,
        "height": height,
        "cursorX": 1,
        "cursorY": 1,
        "cursorBlink": False,
        "rows": {str(y): {} for y in range(1, height + 1)},
    }
    data = evil.encode(
        "computer_response", watch["messageId"], "screen_watch", compact, ok=True, partial=True
    )
    if width > 200:
        alice.transport.pauseProducing()  # 800 KB a frame, before issue 35: not read here
    pid = reactor.gateway_pid
    cpu0 = proc.cpu_seconds(pid)
    started = time.monotonic()
    for _ in range(count):
        evil.sendMessage(data)
    await bounded(evil.probe(), reactor, WAIT)  # every frame before it was handled
    wall = time.monotonic() - started
    cpu = proc.cpu_seconds(pid) - cpu0 - reactor.idle_cpu * wall
    alice.transport.resumeProducing()
    # Answers come in order: once this one is here, the watch's end (if any) came before it.
    await bounded(alice.ask({"id": "p", "traposId": "0:alice", "type": "ping"}), reactor, WAIT)
    outcome: dict[str, Any] = {
        "screen": f"{width}x{height}",
        "frames_sent": count,
        "frame_bytes": len(data),
        "seconds": round(wall, 2),
        "gateway_cpu_ms_per_frame": round(cpu / count * 1000, 3),
    }
    if width <= 200:
        outcome["frames_delivered"] = got[0]
    else:
        answer = ended.result if ended.called else None
        outcome["watch"] = (
            f"ended {answer['status']} {answer['error']['code']}" if answer else "not ended"
        )
    alice.sendClose(1000)
    evil.sendClose(1000)
    return outcome


async def idle_cpu(reactor, pid: int, seconds: float) -> float:
    """
    The gateway's CPU per second while nobody asks it anything (its own
    timers): taken out of each figure, whose span differs (a change waits for
    the listing's debounce since issue 35; before it, none).
    """
    cpu0, wall0 = proc.cpu_seconds(pid), time.monotonic()
    await task.deferLater(reactor, seconds, lambda: None)
    return (proc.cpu_seconds(pid) - cpu0) / (time.monotonic() - wall0)


async def run(reactor, args: argparse.Namespace) -> dict[str, Any]:
    state = tempfile.mkdtemp(prefix="trapsandbox-bench-fairshare-")
    accounts_path = os.path.join(state, "accounts.toml")
    text = ""
    for name in ("alice", "bob"):
        hashed = (accounts.sha256_hex("s-" + name), accounts.sha256_hex("token-" + name))
        text = accounts.with_account(text, accounts.Account(name, *hashed))
    accounts.write_text(accounts_path, text)
    child = harness.spawn_twistd(state, "--accounts-file", accounts_path)
    try:
        port = await _listening(reactor, child)
        reactor.gateway_pid = child.pid
        await bounded(
            defer.gatherResults(
                [connect_computer(port, f"{n}:alice", "s-alice") for n in range(args.computers)]
            ),
            reactor,
            WAIT,
        )
        reactor.idle_cpu = await idle_cpu(reactor, child.pid, args.idle)
        return {
            "computers": args.computers,
            "idle_cpu_ms_per_second": round(reactor.idle_cpu * 1000, 2),
            "changes": [
                await changes(reactor, port, args.computers, args.changes, 1),
                await changes(reactor, port, args.computers, args.changes, SOCKETS * PER_SOCKET),
            ],
            "hostile_frames": [
                await frames(reactor, port, args.frames, (512, 512)),
                await frames(reactor, port, args.frames, (164, 81)),
            ],
            "gateway_rss_mib": round(proc.rss_bytes(child.pid) / 2**20, 1),
        }
    finally:
        child.terminate()
        child.wait(15)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fairshare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--computers", type=int, default=50, help="Alice's computers (50)")
    parser.add_argument("--changes", type=int, default=20, help="connect+leave cycles (20)")
    parser.add_argument("--frames", type=int, default=3000, help="hostile frames sent (3000)")
    parser.add_argument(
        "--idle", type=float, default=5.0, help="seconds the idle CPU is measured over (5)"
    )
    parser.add_argument("--output", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    task.react(
        lambda reactor: defer.ensureDeferred(run(reactor, args)).addCallback(
            harness.show, args.output
        )
    )


if __name__ == "__main__":
    main()
