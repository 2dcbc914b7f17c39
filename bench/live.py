"""
The live screen's figures (SPEC §14): bytes per one-row change, bytes while
idle, key-to-screen latency, and the gateway's CPU with many watched screens.

    python -m bench.live [--idle 10] [--presses 40] [--computers 100] [--seconds 10]
                         [--output FILE]
    python -m bench.live --url URL [--token T] --computer ID [--account A] [--presses 40]

The first form measures everything on this machine:

- bytes and latency: one real gateway (in this process, 127.0.0.1:0) and one
  computer of the CraftOS harness (real Lua 5.2 running the real ``lua/``
  client, 51x19) on the same reactor.  One row changes on the computer; the
  computer's ``screen_watch`` partial (the WebSocket message it sends, whose
  size is read where the harness sends it) and what one watcher receives for
  it (the ``/operator`` message, and the bytes of ``GET .../screen/stream``,
  chunk framing included) are counted.  Then nothing is drawn for ``--idle``
  seconds and every byte on both legs is counted.  Then key-to-screen latency,
  as the second form measures it.
- CPU: a real ``twistd`` gateway and ``--computers`` light computers (Autobahn
  clients in this process speaking the wire protocol: they answer
  ``screen_watch`` with a first frame of every row, then change one row
  ``--rate`` times a second, as the Lua does), each watched by an
  ``/operator`` socket; the gateway's process CPU seconds per wall second
  over ``--seconds`` (from ``/proc``), and the frames the watchers got.

The second form measures key-to-screen latency only, against a gateway that
already runs and a computer already connected (real CraftOS-PC, say), which
must allow exec, fs.write, screen and input: it writes ``/bench-read.lua``
(a program waiting in ``read()``), runs it, and for each of ``--presses``
keys sends ``input {char}`` on an ``/operator`` socket and times until a
screen partial shows it (the operator socket's path: what the web console
uses, without the browser's own drawing).  Enter ends the program.  Keys
are paced ``PACE`` apart so the watch's coalescing (``maxFps`` 20) does not
hold a frame back.
"""

from __future__ import annotations

import argparse
import base64
import os
import random
import string
import subprocess
import tempfile
import time
from typing import Any

import orjson
from autobahn.twisted.websocket import (
    WebSocketClientFactory,
    WebSocketClientProtocol,
    connectWS,
)
from twisted.internet import defer, protocol, task
from twisted.internet.defer import Deferred

from bench import harness, proc

PACE = 0.12  # seconds between key presses (> 1 / maxFps 20)
LINE = 40  # keys typed on one line (it stays within 51 columns), then Enter and again
WAIT = 15.0  # seconds, the bound of every wait
# From the first column, so that BENCH> and LINE keys fit in 51 columns.
READER = (
    "if term.getCursorPos() > 1 then print() end\n"
    "write('BENCH> ')\nlocal got = read()\nprint('got ' .. got)\n"
)


def bounded(d: Deferred, reactor, seconds: float = WAIT) -> Deferred:
    return d.addTimeout(seconds, reactor)


# -- An operator on /operator ----------------------------------------------------------------


class Operator(WebSocketClientProtocol):
    """``/operator`` messages to ``listeners`` (by id); bytes and frames received counted."""

    def onConnect(self, response) -> None:
        self.listeners: dict[Any, Any] = {}
        self.answers: dict[Any, Deferred] = {}
        self.bytes_in = 0
        self.frames_in = 0

    def onOpen(self) -> None:
        self.factory.opened.callback(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.bytes_in += len(payload)
        self.frames_in += 1
        message = orjson.loads(payload)
        key = message.get("id")
        if message.get("partial"):
            listener = self.listeners.get(key)
            if listener is not None:
                listener(message["payload"], len(payload))
        elif key in self.answers:
            self.answers.pop(key).callback(message)

    def onClose(self, wasClean, code, reason) -> None:
        if not self.factory.opened.called:
            self.factory.opened.errback(ConnectionError(f"/operator refused: {code} {reason}"))

    def ask(self, message: dict[str, Any]) -> Deferred:
        d = self.answers[message["id"]] = Deferred()
        self.sendMessage(orjson.dumps(message))
        return d


def open_operator(reactor, url: str, token: str | None) -> Deferred:
    ws_url = url.replace("http", "ws", 1).rstrip("/") + "/operator"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    factory = WebSocketClientFactory(ws_url, headers=headers)
    factory.protocol = Operator
    factory.opened = Deferred()
    connectWS(factory)
    return bounded(factory.opened, reactor)


class RawStream(protocol.Protocol):
    """``GET .../screen/stream`` by hand: every byte after the head is counted, and the
    events (one data line each; a comment is not one); ``on_data`` is called as they come."""

    def __init__(self, head: bytes, on_data) -> None:
        self.head = head
        self.bytes_in = 0
        self.events = 0
        self.on_data = on_data
        self.started: Deferred = Deferred()
        self._headed = False

    def connectionMade(self) -> None:
        self.transport.write(self.head)

    def dataReceived(self, data: bytes) -> None:
        if not self._headed:
            head, sep, rest = data.partition(b"\r\n\r\n")
            if not sep:
                return
            self._headed = True
            self.started.callback(head)
            data = rest
        self.bytes_in += len(data)
        self.events += data.count(b"data: ")
        self.on_data()


# -- Key-to-screen latency (both forms) -------------------------------------------------------


async def latency(
    reactor, url: str, token: str | None, computer: str, account: str | None, presses: int
) -> dict[str, Any]:
    """p50/p95 from ``input {char}`` on /operator to the screen partial showing it."""
    op = await open_operator(reactor, url, token)
    target = {"traposId": computer, **({"account": account} if account else {})}
    write = await bounded(
        op.ask(
            {
                "id": "w",
                **target,
                "type": "write_file",
                "payload": {
                    "path": "/bench-read.lua",
                    "content": _b64(READER),
                    "encoding": "base64",
                },
            }
        ),
        reactor,
    )
    if not write.get("ok"):
        raise RuntimeError(f"cannot write /bench-read.lua: {write}")
    waiting: list[Any] = [None]  # (text to see, Deferred)

    def frame(payload: dict[str, Any], size: int) -> None:
        if waiting[0] is None:
            return
        text, d = waiting[0]
        if any(text in row.get("line", "") for row in payload.get("rows", {}).values()):
            waiting[0] = None
            d.callback(time.perf_counter())

    op.listeners["s"] = frame
    op.sendMessage(
        orjson.dumps({"id": "s", **target, "type": "screen_watch", "payload": {"maxFps": 20}})
    )
    times: list[float] = []
    while len(times) < presses:
        # A round: the program waits in read(); up to LINE keys, then Enter ends it.
        seen = Deferred()
        waiting[0] = ("BENCH> ", seen)
        run = op.ask(
            {
                "id": f"x{len(times)}",
                **target,
                "type": "exec",
                "payload": {"command": "/bench-read.lua"},
            }
        )
        await bounded(seen, reactor)
        typed = ""
        for _ in range(min(LINE, presses - len(times))):
            await task.deferLater(reactor, PACE, lambda: None)
            char = random.choice(string.ascii_letters)
            typed += char
            d = Deferred()
            waiting[0] = ("BENCH> " + typed, d)
            sent = time.perf_counter()
            op.sendMessage(
                orjson.dumps(
                    {
                        "id": f"i{len(times)}",
                        **target,
                        "type": "input",
                        "payload": {"events": [{"char": char}]},
                    }
                )
            )
            times.append(await bounded(d, reactor) - sent)
        op.sendMessage(
            orjson.dumps(
                {
                    "id": "enter",
                    **target,
                    "type": "input",
                    "payload": {"events": [{"key": "enter"}]},
                }
            )
        )
        await bounded(run, reactor)
    op.sendClose(1000)
    return {
        "presses": len(times),
        "p50_ms": round(harness.percentile(times, 0.5) * 1000, 1),
        "p95_ms": round(harness.percentile(times, 0.95) * 1000, 1),
        "max_ms": round(max(times) * 1000, 1),
        "path": "input on /operator -> screen partial on the same socket",
    }


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# -- Bytes per row change and while idle (harness computer) -----------------------------------


async def bytes_and_latency(reactor, args: argparse.Namespace) -> dict[str, Any]:
    gateway, port = harness.start_gateway(reactor)
    c = harness.computer(port, "live", "exec,eval,fs.write,screen,input")
    from tests.harness import craftos  # (on the path once harness.computer put it there)

    sent: list[int] = []  # sizes of the screen partials the computer sent
    original = craftos._WebSocket.sendMessage

    progress = Progress()

    def counted(self, payload, *a, **kw):
        if b'"partial":true' in payload and b'"type":"screen"' in payload:
            sent.append(len(payload))
            progress.changed()
        return original(self, payload, *a, **kw)

    craftos._WebSocket.sendMessage = counted
    url = f"http://127.0.0.1:{port}"
    results: dict[str, Any] = {}
    try:
        await harness.connected(c)
        op = await open_operator(reactor, url, None)
        frames: list[tuple[dict, int]] = []
        op.listeners["s"] = lambda payload, size: (
            frames.append((payload, size)),
            progress.changed(),
        )
        op.sendMessage(
            orjson.dumps(
                {"id": "s", "traposId": "1:live", "type": "screen_watch", "payload": {"maxFps": 20}}
            )
        )
        stream = RawStream(
            b"GET /computers/1%3Alive/screen/stream?maxFps=20 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
            progress.changed,
        )
        await protocol.ClientCreator(reactor, lambda: stream).connectTCP("127.0.0.1", port)
        await bounded(stream.started, reactor)

        async def delivered(since: tuple[int, int, int]) -> None:
            """Until the computer has nothing more coalescing, and each screen partial it
            sent since ``since`` (its counts of sent, frames, events) reached its watcher:
            the one on /operator or the SSE stream."""
            await c.wait_for(lambda: not c._timers, what="no timer armed")
            await progress.until(
                lambda: len(frames) - since[1] + stream.events - since[2] >= len(sent) - since[0],
                reactor,
            )

        await progress.until(lambda: frames and stream.events and len(sent) >= 2, reactor)
        await delivered((0, 0, 0))
        # One row changes: row 5 gets a line of text, drawn by the daemon itself (eval: a new
        # program would open a multishell tab and redraw its bar too).
        before = (len(sent), len(frames), stream.bytes_in, op.bytes_in)
        events_before = stream.events
        changed = op.ask(
            {
                "id": "e",
                "traposId": "1:live",
                "type": "eval",
                "payload": {"code": "term.setCursorPos(1, 5) term.write('one row changed')"},
            }
        )
        await bounded(changed, reactor)
        await progress.until(lambda: len(sent) >= before[0] + 2, reactor)
        await delivered((before[0], before[1], events_before))
        watch_frames = frames[before[1] :]
        results["one_row_change"] = {
            # Two watches run (the /operator one and the SSE one): one partial each.
            "computer_to_gateway_message_bytes": sent[before[0] :],
            "gateway_to_operator_message_bytes": [size for _, size in watch_frames],
            "gateway_to_sse_bytes": stream.bytes_in - before[2],
            "rows_in_frame": [len(payload["rows"]) for payload, _ in watch_frames],
            "note": "WebSocket payload bytes; a frame header adds 2-8 (+4 mask from a client)",
        }
        # Idle: nothing drawn, nothing sent.
        before = (len(sent), sum(sent), stream.bytes_in, op.bytes_in)
        await task.deferLater(reactor, args.idle, lambda: None)
        results["idle"] = {
            "seconds": args.idle,
            "computer_to_gateway_bytes": sum(sent) - before[1],
            "gateway_to_operator_bytes": op.bytes_in - before[3],
            "gateway_to_sse_bytes": stream.bytes_in - before[2],
        }
        op.sendClose(1000)
        stream.transport.loseConnection()
        results["latency_harness"] = await latency(reactor, url, None, "1:live", None, args.presses)
    finally:
        craftos._WebSocket.sendMessage = original
        await c.shutdown()
        await gateway.stopService()
    return results


class Progress:
    """Something counted changed: wakes whoever waits on a condition over the counts."""

    def __init__(self) -> None:
        self._waiting: list[tuple[Any, Deferred]] = []

    def changed(self) -> None:
        waiting, self._waiting = self._waiting, []
        for predicate, d in waiting:
            if d.called:
                continue
            if predicate():
                d.callback(None)
            else:
                self._waiting.append((predicate, d))

    def until(self, predicate, reactor, seconds: float = WAIT) -> Deferred:
        if predicate():
            return defer.succeed(None)
        d: Deferred = Deferred()
        self._waiting.append((predicate, d))
        return bounded(d, reactor, seconds)


# -- CPU with many watched computers (real twistd) -------------------------------------------

BLANK = {"line": " ", "text": "0", "background": "f"}


def encode_frame(
    trapos_id: str, event: str, message_id: str, type: str, payload: dict, **more: Any
) -> bytes:
    """One frame a computer sends (SPEC §2): a ``computer_request`` or ``computer_response``."""
    frame = {
        "event": event,
        "traposSenderId": trapos_id,
        "messageId": message_id,
        "type": type,
        "payload": payload,
        **more,
    }
    return orjson.dumps(frame)


class LightComputer(WebSocketClientProtocol):
    """A computer past hello that answers ``screen_watch`` as the Lua does, one row a tick."""

    def onOpen(self) -> None:
        self.watch: str | None = None
        self.loop: task.LoopingCall | None = None
        self.tick = 0
        self.send_frame(
            "computer_request",
            "hello-1",
            "hello",
            {"traposId": self.factory.trapos_id, "capabilities": ["screen"]},
        )

    def send_frame(self, event: str, message_id: str, type: str, payload: dict, **more) -> None:
        self.sendMessage(
            encode_frame(self.factory.trapos_id, event, message_id, type, payload, **more)
        )

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        frame = orjson.loads(payload)
        if frame.get("event") == "gateway_response" and frame.get("type") == "hello":
            self.factory.ready.callback(self)
            return
        if frame.get("event") != "gateway_request":
            return
        kind, mid = frame["type"], frame["messageId"]
        if kind == "screen_watch":
            self.watch = mid
            rows = {str(y): BLANK for y in range(1, 20)}
            first = {
                "type": "screen",
                "width": 51,
                "height": 19,
                "cursorX": 1,
                "cursorY": 1,
                "cursorBlink": False,
                "rows": rows,
                "palette": ["#f0f0f0"] * 16,
            }
            self.respond(mid, kind, first, partial=True)
            self.loop = task.LoopingCall(self.change)
            self.loop.clock = self.factory.reactor
            self.loop.start(1 / self.factory.rate, now=False)
        elif kind == "cancel":
            if self.loop is not None and self.loop.running:
                self.loop.stop()
            self.respond(mid, kind, {"cancelled": True})
        elif kind == "ping":
            self.respond(mid, kind, {"traposId": self.factory.trapos_id})

    def respond(self, mid: str, type: str, payload: dict, partial: bool = False) -> None:
        more = {"ok": True, **({"partial": True} if partial else {})}
        self.send_frame("computer_response", mid, type, payload, **more)

    def change(self) -> None:
        self.tick += 1
        y = self.tick % 19 + 1
        line = f"tick {self.tick} on {self.factory.trapos_id}"
        self.respond(
            self.watch,
            "screen_watch",
            {
                "type": "screen",
                "cursorX": len(line) + 1,
                "cursorY": y,
                "rows": {str(y): {"line": line + " ", "text": "0", "background": "f"}},
            },
            partial=True,
        )

    def onClose(self, wasClean, code, reason) -> None:
        if self.loop is not None and self.loop.running:
            self.loop.stop()


async def cpu(reactor, args: argparse.Namespace) -> dict[str, Any]:
    child = harness.spawn_twistd(tempfile.mkdtemp(prefix="trapsandbox-bench-state-"))
    try:
        port = await _listening(reactor, child)
        url = f"http://127.0.0.1:{port}"
        computers = []
        for i in range(args.computers):
            factory = WebSocketClientFactory(f"ws://127.0.0.1:{port}/gateway?n={i}")
            factory.protocol = LightComputer
            factory.trapos_id = f"{i}:light"
            factory.rate = args.rate
            factory.reactor = reactor
            factory.ready = Deferred()
            connectWS(factory)
            computers.append(factory.ready)
        await bounded(defer.gatherResults(computers), reactor, 60)
        watchers = [await open_operator(reactor, url, None) for _ in range(args.computers)]
        running = []
        for i, op in enumerate(watchers):
            first: Deferred = Deferred()
            op.listeners["s"] = lambda _, __, d=first: None if d.called else d.callback(None)
            running.append(first)
            op.sendMessage(
                orjson.dumps({"id": "s", "traposId": f"{i}:light", "type": "screen_watch"})
            )
        await bounded(defer.gatherResults(running), reactor, 60)  # every watch has its frames
        frames0 = sum(op.frames_in for op in watchers)
        cpu0, wall0 = proc.cpu_seconds(child.pid), time.monotonic()
        await task.deferLater(reactor, args.seconds, lambda: None)
        cpu1, wall1 = proc.cpu_seconds(child.pid), time.monotonic()
        frames = sum(op.frames_in for op in watchers) - frames0
        for op in watchers:
            op.sendClose(1000)
        wall = wall1 - wall0
        return {
            "computers": args.computers,
            "watchers": len(watchers),
            "row_changes_per_second_each": args.rate,
            "seconds": round(wall, 2),
            "gateway_cpu_seconds_per_second": round((cpu1 - cpu0) / wall, 3),
            "frames_delivered_per_second": round(frames / wall),
            "frames_expected_per_second": args.computers * args.rate,
            "gateway_rss_mib": round(proc.rss_bytes(child.pid) / 2**20, 1),
        }
    finally:
        child.terminate()
        child.wait(15)


async def _listening(reactor, child: subprocess.Popen) -> int:
    """The port twistd says it listens on (its log line), read in a thread."""
    from twisted.internet import threads

    def read() -> int:
        deadline = time.monotonic() + 30
        for line in child.stdout:
            text = line.decode(errors="replace")
            if "listening on 127.0.0.1:" in text:
                return int(text.rsplit(":", 1)[1].split()[0])
            if time.monotonic() > deadline:
                break
        raise RuntimeError("twistd did not say where it listens")

    port = await threads.deferToThread(read)
    # Keep draining its output so it never blocks on a full pipe.
    threads.deferToThread(lambda: [None for _ in child.stdout])
    return port


# -- Main ------------------------------------------------------------------------------------


async def report(reactor, args: argparse.Namespace) -> None:
    if args.url:
        outcome = {
            "latency": await latency(
                reactor, args.url, args.token, args.computer, args.account, args.presses
            )
        }
    else:
        outcome = await bytes_and_latency(reactor, args)
        if args.computers:
            outcome["cpu"] = await cpu(reactor, args)
    harness.show(outcome, args.output)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.live",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", help="a running gateway: measure latency only, there")
    parser.add_argument("--token", default=os.environ.get("TRAPSANDBOX_TOKEN"))
    parser.add_argument("--computer", help="with --url: the computer's traposId")
    parser.add_argument("--account", help="with --url and the admin token: the computer's account")
    parser.add_argument("--presses", type=int, default=40, help="keys timed (40)")
    parser.add_argument("--idle", type=float, default=10.0, help="idle seconds counted (10)")
    parser.add_argument("--computers", type=int, default=100, help="watched computers (100)")
    parser.add_argument("--rate", type=float, default=10.0, help="row changes a second each")
    parser.add_argument("--seconds", type=float, default=10.0, help="CPU measured over (10)")
    parser.add_argument("--output", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.url and not args.computer:
        parser.error("--url needs --computer")
    task.react(lambda reactor: defer.ensureDeferred(report(reactor, args)))


if __name__ == "__main__":
    main()
