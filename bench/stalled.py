"""
The stream budget under stalled readers (issue 43): what 64 server-sent-event
screen streams that never read cost the gateway, and another account's
latency meanwhile.

    python -m bench.stalled [--readers 64] [--seconds 60] [--fps 20] [--baseline 5]
                            [--max-rss-mib 3072] [--output FILE]

A real ``twistd`` gateway (127.0.0.1:0, an accounts file of two accounts,
alice and bob) and, in this process:

- alice's computer ``0:alice``, an Autobahn client speaking the wire protocol
  (as ``bench.fairshare``'s): it answers every ``screen_watch`` with a first
  frame of a 164x81 screen, then, ``--fps`` times a second, a frame in which
  every one of the 81 rows changes (its text, its colours), to every watch it
  holds.  Its frames are compact as the Lua sends them (a row is a short text
  and its run of blanks cut to one), which the gateway expands to whole rows
  for its watchers: 4.9 KB on the computer's wire, 43 KB of JSON per watcher.
  A tick is skipped (and counted) while the computer's own socket is full;
- ``--readers`` raw TCP connections with alice's token, each ``SO_RCVBUF``
  4096 set before it connects, sending ``GET /computers/0:alice/screen/stream
  ?maxFps=20`` and never reading a byte (no ``recv``);
- bob's computer ``0:bob``, answering ``ping``, and bob's token asking it
  ``POST /computers/0:bob/requests {"type": "ping"}`` ``PING_RATE`` times a
  second (each sent on time whether or not the last was answered, over a
  persistent-connection pool), timed from send to the body read.

Bob's pings run ``--baseline`` seconds before the readers connect (the
figures without them), then for ``--seconds`` with them.  The gateway's RSS
(``/proc/PID/statm``) is read once the readers' watches all run on the
computer ("start"), every 10 s, and at the end, and every second for the
peak; its CPU (``/proc/PID/stat``) per second over each 10 s and the whole
run.  The run stops early once the gateway's RSS passes ``--max-rss-mib`` (a
gateway that keeps what it cannot send would otherwise take the machine
down): the figures then say so.  The readers are closed at the end, the RSS
read again 2 s later, and the gateway stopped.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import time
from typing import Any
from urllib.parse import quote

import orjson
import treq
from autobahn.twisted.websocket import WebSocketClientFactory, connectWS
from twisted.internet import defer, task, threads
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer
from twisted.web.client import HTTPConnectionPool
from zope.interface import implementer

from bench import fairshare, harness, proc
from bench.live import _listening, bounded
from trapsandbox.admission import accounts

WIDTH, HEIGHT = 164, 81  # CraftOS's largest monitor
RCVBUF = 4096  # each stalled reader's receive buffer, set before it connects
PING_RATE = 10.0  # bob's pings a second
PING_TIMEOUT = 10.0  # a ping not answered by then is counted failed
SLOW = 0.1  # a ping slower than this is listed (the target for p99)
SAMPLE_EVERY = 10.0  # seconds between the RSS and CPU figures reported
WAIT = 30.0
HEX = "0123456789abcdef"
MiB = 2**20


@implementer(IPushProducer)
class Full:
    """Whether the computer's socket has more waiting than Twisted's buffer: the
    transport's own pause and resume."""

    def __init__(self) -> None:
        self.paused = False

    def pauseProducing(self) -> None:
        self.paused = True

    def resumeProducing(self) -> None:
        self.paused = False

    def stopProducing(self) -> None:
        self.paused = True


class Drawing(fairshare.Computer):
    """Alice's computer: every ``screen_watch`` it is asked gets the whole screen changed,
    ``factory.fps`` times a second, until it is cancelled."""

    def onOpen(self) -> None:
        super().onOpen()
        self.watches: dict[str, bool] = {}  # messageId -> its first frame sent
        self.asked = 0  # screen_watch requests heard
        self.tick = 0
        self.frames_sent = 0  # screen partials sent, every watch counted
        self.bytes_sent = 0
        self.ticks_skipped = 0  # while its own socket was full
        self.waiting: tuple[int, Deferred] | None = None
        self.full = Full()
        self.transport.registerProducer(self.full, True)
        self.loop = task.LoopingCall(self.draw)
        self.loop.clock = self.factory.reactor
        self.loop.start(1 / self.factory.fps, now=False)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        frame = orjson.loads(payload)
        if frame.get("event") == "gateway_request" and frame.get("type") == "screen_watch":
            self.watches[frame["messageId"]] = False
            self.asked += 1
            if self.waiting is not None and len(self.watches) >= self.waiting[0]:
                d, self.waiting = self.waiting[1], None
                d.callback(None)
        elif frame.get("event") == "gateway_request" and frame.get("type") == "cancel":
            watched = self.watches.pop(frame.get("payload", {}).get("messageId"), None)
            self.send_frame(
                "computer_response",
                frame["messageId"],
                "cancel",
                {"cancelled": watched is not None},
                ok=True,
            )
        else:
            super().onMessage(payload, isBinary)

    def until_watched(self, count: int) -> Deferred:
        """Fires once ``count`` watches run here."""
        if len(self.watches) >= count:
            return defer.succeed(None)
        d: Deferred = Deferred()
        self.waiting = (count, d)
        return bounded(d, self.factory.reactor, WAIT)

    def draw(self) -> None:
        if not self.watches:
            return
        if self.full.paused:
            self.ticks_skipped += 1
            return
        self.tick += 1
        t = self.tick
        rows = {
            str(y): {
                "line": f"frame {t} row {y} ",
                "text": HEX[(t + y) % 16],
                "background": HEX[(t + y + 8) % 16],
            }
            for y in range(1, HEIGHT + 1)
        }
        later = {"type": "screen", "cursorX": 1, "cursorY": t % HEIGHT + 1, "rows": rows}
        first = {
            **later,
            "width": WIDTH,
            "height": HEIGHT,
            "cursorBlink": False,
            "palette": ["#f0f0f0"] * 16,
        }
        for mid, started in list(self.watches.items()):
            data = self.encode(
                "computer_response",
                mid,
                "screen_watch",
                later if started else first,
                ok=True,
                partial=True,
            )
            self.watches[mid] = True
            self.sendMessage(data)
            self.frames_sent += 1
            self.bytes_sent += len(data)

    def onClose(self, wasClean, code, reason) -> None:
        if self.loop.running:
            self.loop.stop()
        super().onClose(wasClean, code, reason)


def connect_drawing(reactor, port: int, trapos_id: str, secret: str, fps: float) -> Deferred:
    factory = WebSocketClientFactory(f"ws://127.0.0.1:{port}/gateway?b={trapos_id}")
    factory.protocol = Drawing
    factory.trapos_id = trapos_id
    factory.secret = secret
    factory.fps = fps
    factory.reactor = reactor
    factory.ready = Deferred()
    connectWS(factory)
    return factory.ready


def stalled_reader(port: int, path: str, token: str) -> socket.socket:
    """A connection that asks ``path`` and never reads: its small receive buffer set first."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
    s.settimeout(WAIT)
    s.connect(("127.0.0.1", port))
    s.sendall(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    return s


class Pinger:
    """Bob's pings, ``PING_RATE`` a second, each timed; ``phase`` names where they go."""

    def __init__(self, reactor, port: int, trapos_id: str, token: str) -> None:
        self.reactor = reactor
        self.url = f"http://127.0.0.1:{port}/computers/{quote(trapos_id, safe='')}/requests"
        self.headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
        }
        self.pool = HTTPConnectionPool(reactor, persistent=True)
        self.pool.maxPersistentPerHost = 8
        self.phases: dict[str, dict[str, Any]] = {}
        self.phase = "baseline"
        self.outstanding: set[Deferred] = set()
        self.loop = task.LoopingCall(self.ping)
        self.loop.clock = reactor

    def start(self) -> None:
        self.started = time.perf_counter()
        self.loop.start(1 / PING_RATE, now=True)

    def ping(self) -> None:
        phase = self.phases.setdefault(self.phase, {"times": [], "failed": {}, "slow": []})
        sent = time.perf_counter()

        async def one() -> None:
            try:
                response = await treq.post(
                    self.url,
                    b'{"type": "ping"}',
                    headers=self.headers,
                    pool=self.pool,
                    reactor=self.reactor,
                    timeout=PING_TIMEOUT,
                )
                body = await response.content()
                if response.code != 200 or not orjson.loads(body).get("ok"):
                    why = f"{response.code} {body[:80]!r}"
                    phase["failed"][why] = phase["failed"].get(why, 0) + 1
                    return
                took = time.perf_counter() - sent
                phase["times"].append(took)
                if took > SLOW:
                    phase["slow"].append((round(sent - self.started, 1), round(took * 1000)))
            except Exception as error:  # a timeout, a refused connection: counted
                why = type(error).__name__
                phase["failed"][why] = phase["failed"].get(why, 0) + 1

        d = defer.ensureDeferred(one())
        self.outstanding.add(d)
        d.addBoth(lambda _: self.outstanding.discard(d))

    async def stop(self) -> None:
        if self.loop.running:
            self.loop.stop()
        if self.outstanding:
            await defer.DeferredList(list(self.outstanding))
        await self.pool.closeCachedConnections()

    def figures(self, name: str) -> dict[str, Any]:
        phase = self.phases.get(name, {"times": [], "failed": {}, "slow": []})
        times = phase["times"]
        out: dict[str, Any] = {"answered": len(times), "failed": phase["failed"]}
        # (When, in seconds since the first ping, and how long: the first few over SLOW.)
        out["over_100ms"] = {"count": len(phase["slow"]), "first": phase["slow"][:10]}
        if times:
            out.update(
                p50_ms=round(harness.percentile(times, 0.5) * 1000, 1),
                p99_ms=round(harness.percentile(times, 0.99) * 1000, 1),
                max_ms=round(max(times) * 1000, 1),
            )
        return out


def mib(n: int) -> float:
    return round(n / MiB, 1)


async def measure(reactor, args: argparse.Namespace, pid: int, port: int) -> dict[str, Any]:
    alice = await bounded(connect_drawing(reactor, port, "0:alice", "s-alice", args.fps), reactor)
    await bounded(fairshare.connect_computer(port, "0:bob", "s-bob"), reactor)
    pinger = Pinger(reactor, port, "0:bob", "token-bob")
    readers: list[socket.socket] = []
    outcome: dict[str, Any] = {
        "readers": args.readers,
        "fps": args.fps,
        "screen": f"{WIDTH}x{HEIGHT}, every row changed each frame",
        "reader_rcvbuf": RCVBUF,
        "pings_per_second": PING_RATE,
    }
    try:
        pinger.start()
        await task.deferLater(reactor, args.baseline, lambda: None)
        rss_idle = proc.rss_bytes(pid)
        pinger.phase = "stalled"
        path = f"/computers/{quote('0:alice', safe='')}/screen/stream?maxFps=20"
        for _ in range(args.readers):
            # In a thread: a blocking connect here held this reactor, and so bob's pings (one
            # of them by 1 s, as long as a SYN sent again waits).
            readers.append(await threads.deferToThread(stalled_reader, port, path, "token-alice"))
        await alice.until_watched(args.readers)
        frames0, bytes0, skipped0 = alice.frames_sent, alice.bytes_sent, alice.ticks_skipped
        own0 = proc.own_cpu_seconds()
        start = time.monotonic()
        rss_start = peak = proc.rss_bytes(pid)
        cpu_start = cpu_last = proc.cpu_seconds(pid)
        samples = [{"t": 0, "rss_mib": mib(rss_start)}]
        stopped_early = None
        last = 0.0  # when the last sample was taken
        next_sample = SAMPLE_EVERY
        while True:
            await task.deferLater(reactor, 1.0, lambda: None)
            elapsed = time.monotonic() - start
            rss = proc.rss_bytes(pid)
            peak = max(peak, rss)
            if rss > args.max_rss_mib * MiB:
                stopped_early = (
                    f"gateway RSS {mib(rss)} MiB > {args.max_rss_mib} MiB at {elapsed:.0f} s"
                )
            if elapsed >= next_sample - 0.05 or elapsed >= args.seconds or stopped_early:
                cpu = proc.cpu_seconds(pid)
                samples.append(
                    {
                        "t": round(elapsed),
                        "rss_mib": mib(rss),
                        "cpu_s_per_s": round((cpu - cpu_last) / max(elapsed - last, 1e-9), 3),
                    }
                )
                cpu_last, last = cpu, elapsed
                next_sample += SAMPLE_EVERY
            if elapsed >= args.seconds or stopped_early:
                break
        wall = time.monotonic() - start
        rss_end = proc.rss_bytes(pid)
        cpu_total = proc.cpu_seconds(pid) - cpu_start
        own = proc.own_cpu_seconds() - own0
        await pinger.stop()
        outcome.update(
            {
                "seconds": round(wall, 1),
                "stopped_early": stopped_early,
                "streams_watched_on_computer": alice.asked,
                "gateway_rss_mib": {
                    "before_readers": mib(rss_idle),
                    "start": mib(rss_start),
                    "every_10s": samples,
                    "end": mib(rss_end),
                    "peak": mib(peak),
                    "growth": mib(rss_end - rss_start),
                    "peak_growth": mib(peak - rss_start),
                },
                "gateway_cpu_s_per_s": round(cpu_total / wall, 3),
                "computer": {
                    "frames_sent": alice.frames_sent - frames0,
                    "frames_sent_per_second": round((alice.frames_sent - frames0) / wall),
                    "bytes_sent_mib": mib(alice.bytes_sent - bytes0),
                    "ticks_skipped_socket_full": alice.ticks_skipped - skipped0,
                },
                "bob_ping_baseline": pinger.figures("baseline"),
                "bob_ping_with_readers": pinger.figures("stalled"),
                "bench_process_cpu_s_per_s": round(own / wall, 3),
            }
        )
    finally:
        await pinger.stop()
        for s in readers:
            s.close()
    await task.deferLater(reactor, 2.0, lambda: None)
    outcome["gateway_rss_mib"]["2s_after_readers_closed"] = mib(proc.rss_bytes(pid))
    outcome["watches_left_on_computer"] = len(alice.watches)
    alice.sendClose(1000)
    return outcome


async def run(reactor, args: argparse.Namespace) -> dict[str, Any]:
    state = tempfile.mkdtemp(prefix="trapsandbox-bench-stalled-")
    accounts_path = os.path.join(state, "accounts.toml")
    text = ""
    for name in ("alice", "bob"):
        hashed = (accounts.sha256_hex("s-" + name), accounts.sha256_hex("token-" + name))
        text = accounts.with_account(text, accounts.Account(name, *hashed))
    accounts.write_text(accounts_path, text)
    child = harness.spawn_twistd(state, "--accounts-file", accounts_path)
    try:
        port = await _listening(reactor, child)
        return await measure(reactor, args, child.pid, port)
    finally:
        child.terminate()
        try:
            child.wait(15)
        except Exception:
            child.kill()
            child.wait(15)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.stalled",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--readers", type=int, default=64, help="stalled SSE readers (64)")
    parser.add_argument("--seconds", type=float, default=60.0, help="run with them (60)")
    parser.add_argument("--fps", type=float, default=20.0, help="the computer's frames/s (20)")
    parser.add_argument(
        "--baseline", type=float, default=5.0, help="seconds of pings before the readers (5)"
    )
    parser.add_argument(
        "--max-rss-mib",
        type=float,
        default=3072.0,
        help="stop early once the gateway's RSS passes this (3072)",
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
