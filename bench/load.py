"""
The load generator: simulated computers over 127.0.0.1, written for speed.

asyncio on uvloop, the picows WebSocket client (Cython: frame parsing and
masking in C), frames built by bytes formatting and read with orjson, and a
hand-written HTTP/1.1 keep-alive client for the gateway's HTTP endpoints.  It
runs in its own process, pinned by ``bench.run`` to a CPU other than the
server's, and reports its own CPU beside the server's (from ``/proc``), saying
which side was the bottleneck.

    python -m bench.load SPEC_JSON      prints one JSON line: the figures

Every scenario is bounded in count and in time and closes what it opened.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import orjson
from picows import WSCloseCode, WSListener, WSMsgType, ws_connect

from bench import proc
from trapsandbox.limits import PROBE_FRESH_FOR

TEXT = WSMsgType.TEXT
CLOSE = WSMsgType.CLOSE
PING = WSMsgType.PING
perf_counter = time.perf_counter
loads = orjson.loads

REQUEST = (
    b'{"event":"computer_request","traposSenderId":"%b","messageId":"%d","type":"%b","payload":%b}'
)
PING_ANSWER = (
    b'{"event":"computer_response","traposSenderId":"%b","messageId":%b,'
    b'"type":"ping","ok":true,"payload":{"traposId":"%b"}}'
)
UNKNOWN_ANSWER = (
    b'{"event":"computer_response","traposSenderId":"%b","messageId":%b,"type":%b,'
    b'"ok":false,"error":{"code":"unknown_type","message":"not a bench request"}}'
)

# A side whose CPU is at or above this share of its core is saturated.
SATURATED = 0.85
OPEN_TIMEOUT = 15.0
CLOSE_TIMEOUT = 15.0

Callback = Callable[["Computer", "dict[str, Any] | None", float], None]


class BenchError(Exception):
    pass


def percentiles(samples: list[float]) -> dict[str, float | None]:
    """p50, p99, max and mean of latencies in seconds, as milliseconds."""
    if not samples:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None, "mean_ms": None}
    ordered = sorted(samples)
    last = len(ordered) - 1

    def at(p: float) -> float:
        return round(ordered[min(last, int(p * len(ordered)))] * 1000, 3)

    return {
        "p50_ms": at(0.50),
        "p99_ms": at(0.99),
        "max_ms": round(ordered[-1] * 1000, 3),
        "mean_ms": round(sum(ordered) / len(ordered) * 1000, 3),
    }


class Computer(WSListener):
    """One simulated computer: requests with callbacks, answers ``ping``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, trapos_id: str) -> None:
        self.loop = loop
        self.trapos_id = trapos_id
        self.sender = trapos_id.encode()
        self.transport = None
        self.pending: dict[str, tuple[float, Callback]] = {}
        self.seq = 0
        self.closed = loop.create_future()
        self.close_code: int | None = None
        self.unexpected = 0
        self.pings = 0
        self.ws_pings = 0

    # picows callbacks

    def on_ws_connected(self, transport) -> None:
        self.transport = transport

    def on_ws_frame(self, transport, frame) -> None:
        kind = frame.msg_type
        if kind == TEXT:
            self.on_text(frame.get_payload_as_bytes())
        elif kind == PING:
            # The server's auto-ping (answered here rather than by picows, to count it).
            self.ws_pings += 1
            transport.send_pong(frame.get_payload_as_bytes())
        elif kind == CLOSE:
            self.close_code = int(frame.get_close_code())
            if not transport.is_close_frame_sent:
                transport.send_close(WSCloseCode.OK)
                transport.disconnect()
            # Otherwise it answers our close; the server drops the TCP connection.

    def on_ws_disconnected(self, transport) -> None:
        if not self.closed.done():
            self.closed.set_result(self.close_code)
        pending, self.pending = self.pending, {}
        for _, callback in pending.values():
            callback(self, None, 0.0)

    # Frames

    def on_text(self, data: bytes) -> None:
        message = loads(data)
        if message.get("event") == "gateway_request":
            self.answer(message)
            return
        entry = self.pending.pop(message.get("messageId"), None)
        if entry is None:
            self.unexpected += 1
            return
        entry[1](self, message, perf_counter() - entry[0])

    def answer(self, message: dict[str, Any]) -> None:
        message_id = orjson.dumps(message.get("messageId"))
        if message.get("type") == "ping":
            self.pings += 1
            frame = PING_ANSWER % (self.sender, message_id, self.sender)
        else:
            frame = UNKNOWN_ANSWER % (self.sender, message_id, orjson.dumps(message.get("type")))
        self.transport.send(TEXT, frame)

    def request(self, type: bytes, payload: bytes, callback: Callback) -> None:
        self.seq += 1
        self.pending[str(self.seq)] = (perf_counter(), callback)
        self.transport.send(TEXT, REQUEST % (self.sender, self.seq, type, payload))

    def call(self, type: bytes, payload: bytes = b"{}") -> asyncio.Future:
        """Fires with ``(message or None, latency, time received)``."""
        future = self.loop.create_future()

        def done(computer, message, latency) -> None:
            if not future.done():
                future.set_result((message, latency, perf_counter()))

        self.request(type, payload, done)
        return future

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_close_frame_sent:
            self.transport.send_close(WSCloseCode.OK)


class Operator(WSListener):
    """One operator on ``/operator``: one request at a time, answers matched by arrival."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport = None
        self.waiter: asyncio.Future | None = None
        self.closed = loop.create_future()

    def on_ws_connected(self, transport) -> None:
        self.transport = transport

    def on_ws_frame(self, transport, frame) -> None:
        kind = frame.msg_type
        if kind == TEXT:
            waiter, self.waiter = self.waiter, None
            if waiter is not None and not waiter.done():
                waiter.set_result(frame.get_payload_as_bytes())
        elif kind == PING:
            transport.send_pong(frame.get_payload_as_bytes())
        elif kind == CLOSE and not transport.is_close_frame_sent:
            transport.send_close(WSCloseCode.OK)
            transport.disconnect()

    def on_ws_disconnected(self, transport) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("the operator socket closed"))

    async def call(self, data: bytes) -> bytes:
        self.waiter = self.loop.create_future()
        self.transport.send(TEXT, data)
        return await self.waiter

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_close_frame_sent:
            self.transport.send_close(WSCloseCode.OK)


class Http(asyncio.Protocol):
    """A minimal HTTP/1.1 keep-alive client: one request at a time."""

    def __init__(self) -> None:
        self.transport = None
        self.buffer = b""
        self.waiter: asyncio.Future | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("HTTP connection lost"))

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.waiter is None:
            return
        parsed = _parse_response(self.buffer)
        if parsed is not None:
            status, body, self.buffer = parsed
            waiter, self.waiter = self.waiter, None
            if not waiter.done():
                waiter.set_result((status, body))

    async def request(
        self, method: str, path: str, host: str, body: bytes = b"", headers: dict | None = None
    ) -> tuple[int, bytes]:
        head = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
        head += [f"{name}: {value}" for name, value in (headers or {}).items()]
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        return await self.waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def _parse_response(buffer: bytes) -> tuple[int, bytes, bytes] | None:
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = buffer[:end].split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    rest = buffer[end + 4 :]
    if b"content-length" in headers:
        length = int(headers[b"content-length"])
        if len(rest) < length:
            return None
        return status, rest[:length], rest[length:]
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        body = b""
        while True:
            line_end = rest.find(b"\r\n")
            if line_end < 0:
                return None
            size = int(rest[:line_end].split(b";")[0], 16)
            if len(rest) < line_end + 2 + size + 2:
                return None
            body += rest[line_end + 2 : line_end + 2 + size]
            rest = rest[line_end + 2 + size + 2 :]
            if size == 0:
                return status, body, rest
    return status, rest, b""  # no length: a body up to the close (not expected)


class Meter:
    """CPU of the server, the generator and the fake opencode, and wall time, over a span."""

    def __init__(self, generator: Generator) -> None:
        self.g = generator
        self.start = self._sample()

    def _sample(self) -> dict[str, float]:
        sample = {
            "wall": perf_counter(),
            "server": proc.cpu_seconds(self.g.server_pid),
            "generator": proc.own_cpu_seconds(),
            "system": proc.system_busy_seconds(),
            "fake": 0.0,
        }
        if self.g.fake_pid:
            sample["fake"] = proc.cpu_seconds(self.g.fake_pid)
        return sample

    def stop(self, operations: int | None) -> dict[str, Any]:
        end = self._sample()
        delta = {key: end[key] - self.start[key] for key in end}
        wall = delta["wall"]
        share = {key: delta[key] / wall if wall > 0 else 0.0 for key in delta}
        other = max(0.0, share["system"] - share["server"] - share["generator"] - share["fake"])
        figures: dict[str, Any] = {
            "wall_s": round(wall, 3),
            "server_cpu_s": round(delta["server"], 3),
            "server_cpu_pct": round(share["server"] * 100, 1),
            "generator_cpu_pct": round(share["generator"] * 100, 1),
            "fake_opencode_cpu_pct": round(share["fake"] * 100, 1),
            "other_cpu_pct": round(other * 100, 1),
        }
        if operations:
            figures["server_cpu_us_per_op"] = round(delta["server"] / operations * 1e6, 1)
        # The generator shares its core with the fake opencode.
        client_side = share["generator"] + share["fake"]
        if share["server"] >= SATURATED:
            figures["bottleneck"] = "server"
        elif client_side >= SATURATED:
            figures["bottleneck"] = "generator"
            figures["note"] = (
                "the load generator saturated its core, not the server: "
                "the server's figures are a lower bound"
            )
        elif other >= 0.5:
            figures["bottleneck"] = "other processes"
            figures["note"] = f"other processes used {other * 100:.0f} % of a core: noisy"
        else:
            figures["bottleneck"] = "neither (latency-bound)"
        return figures


class Generator:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.target = spec["target"]
        # The Node peer speaks the same protocol and operator API as the gateway.
        self.gateway = self.target.startswith("gateway") or self.target == "fastify"
        self.url = spec["url"]
        self.host, port = spec["address"].rsplit(":", 1)
        self.port = int(port)
        self.server_pid = spec["server_pid"]
        self.fake_pid = spec.get("fake_pid")
        self.fake_port = spec.get("fake_port")
        self.secret = spec.get("secret")
        self.admin_token = spec.get("admin_token")
        self.loop = asyncio.get_running_loop()
        self.ids = 0

    def log(self, text: str) -> None:
        print(f"  [{self.target}] {text}", file=sys.stderr, flush=True)

    def count_error(self, errors: Counter, error: BaseException) -> None:
        name = type(error).__name__
        if name not in errors:
            self.log(f"first {name}: {error}")
        errors[name] += 1

    def next_ids(self, count: int, label: str) -> list[str]:
        first, self.ids = self.ids, self.ids + count
        return [f"{i}:{label}" for i in range(first, first + count)]

    # Computers

    def hello_payload(self, trapos_id: str) -> bytes:
        payload = {"traposId": trapos_id, "version": "bench"}
        if self.secret is not None:
            payload["secret"] = self.secret
        return orjson.dumps(payload)

    def failed(self, message: dict[str, Any] | None) -> str | None:
        """Why an answer is not a success, or None."""
        if message is None:
            return "disconnected"
        if not self.gateway:
            return None  # the echo of our own request
        if message.get("ok") is not True:
            return (message.get("error") or {}).get("code", "not ok")
        return None

    async def open_computer(self, trapos_id: str) -> tuple[Computer, float]:
        """Connect and complete hello; returns the computer and the time it took."""
        started = perf_counter()
        _, computer = await ws_connect(
            lambda: Computer(self.loop, trapos_id),
            self.url,
            websocket_handshake_timeout=OPEN_TIMEOUT,
            enable_auto_pong=False,
        )
        message, _, _ = await computer.call(b"hello", self.hello_payload(trapos_id))
        why = self.failed(message)
        if why is not None:
            computer.close()
            raise BenchError(f"hello failed: {why}")
        return computer, perf_counter() - started

    async def open_many(
        self, ids: list[str], concurrency: int, timeout: float
    ) -> tuple[list[Computer], list[float], Counter]:
        """Open ``ids`` with at most ``concurrency`` handshakes at once."""
        computers: list[Computer] = []
        latencies: list[float] = []
        errors: Counter = Counter()
        queue = iter(ids)
        deadline = perf_counter() + timeout

        async def worker() -> None:
            for trapos_id in queue:
                if perf_counter() > deadline:
                    errors["deadline"] += 1
                    continue
                try:
                    computer, latency = await asyncio.wait_for(
                        self.open_computer(trapos_id), OPEN_TIMEOUT
                    )
                except Exception as error:  # counted, never fatal
                    self.count_error(errors, error)
                    continue
                computers.append(computer)
                latencies.append(latency)

        await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(ids))))))
        if errors:
            self.log(f"connection errors: {dict(errors)}")
        return computers, latencies, errors

    async def close_many(self, computers: list[Computer]) -> int:
        """Close with 1000 and wait (bounded); abort the stragglers. Returns how many."""
        for computer in computers:
            computer.close()
        waiting = [c.closed for c in computers if not c.closed.done()]
        if waiting:
            await asyncio.wait(waiting, timeout=CLOSE_TIMEOUT)
        stragglers = [c for c in computers if not c.closed.done()]
        for computer in stragglers:
            computer.transport.disconnect(graceful=False)
        return len(stragglers)

    # HTTP

    async def http(self, port: int | None = None) -> Http:
        _, client = await self.loop.create_connection(Http, self.host, port or self.port)
        return client

    async def http_get_json(self, path: str, port: int | None = None) -> tuple[int, Any]:
        client = await self.http(port)
        try:
            status, body = await asyncio.wait_for(
                client.request("GET", path, f"{self.host}:{port or self.port}"), 10
            )
        finally:
            client.close()
        return status, loads(body) if body else None

    async def opencode_requests(self) -> int | None:
        if not self.fake_port:
            return None
        _, body = await self.http_get_json("/_bench/count", self.fake_port)
        return body["requests"]

    async def registered(self) -> int | None:
        if not self.gateway:
            return None
        status, body = await self.http_get_json("/health")
        return body.get("computers") if status == 200 else None

    def rss(self) -> int:
        return proc.rss_bytes(self.server_pid)

    # Scenarios

    async def warm_up(self) -> None:
        """A few computers through hello and health first: a fresh server's first calls are slow."""
        computers, _, _ = await self.open_many(self.next_ids(8, "warmup"), 8, 20)
        await asyncio.gather(*(c.call(b"health") for c in computers))
        await self.close_many(computers)

    async def connect(self, computers: int, concurrency: int) -> dict[str, Any]:
        ids = self.next_ids(computers, "connect")
        meter = Meter(self)
        opened, latencies, errors = await self.open_many(ids, concurrency, timeout=120)
        figures = meter.stop(len(opened))
        figures.update(
            computers=computers,
            concurrency=concurrency,
            connected=len(opened),
            errors=dict(errors),
            hellos_per_s=round(len(opened) / figures["wall_s"], 1),
            handshake=percentiles(latencies),
        )
        figures["stragglers"] = await self.close_many(opened)
        return figures

    async def idle(self, steps: list[int], window: float, concurrency: int) -> dict[str, Any]:
        computers: list[Computer] = []
        rss_before = self.rss()
        rows = []
        errors: Counter = Counter()
        for step in steps:
            ids = self.next_ids(step - len(computers), "idle")
            opened, _, step_errors = await self.open_many(ids, concurrency, timeout=120)
            computers += opened
            errors.update(step_errors)
            # Let the last answers' buffers go before reading the RSS.
            await asyncio.sleep(0.5)
            rss = self.rss()
            rows.append(
                {
                    "computers": len(computers),
                    "rss_bytes": rss,
                    "bytes_per_computer": round((rss - rss_before) / max(1, len(computers))),
                }
            )
            self.log(
                f"idle: {len(computers)} computers, RSS {rss / 2**20:.1f} MiB, "
                f"{rows[-1]['bytes_per_computer']} B each"
            )
        meter = Meter(self)
        await asyncio.sleep(window)
        figures = meter.stop(None)
        registered = await self.registered()
        figures.update(
            rss_before_bytes=rss_before,
            steps=rows,
            errors=dict(errors),
            computers=len(computers),
            registered=registered,
            bytes_per_computer=rows[-1]["bytes_per_computer"] if rows else None,
            idle_window_s=window,
            idle_cpu_pct=figures["server_cpu_pct"],
            websocket_pings_answered=sum(c.ws_pings for c in computers),
        )
        if len(rows) > 1:
            grown = rows[-1]["rss_bytes"] - rows[0]["rss_bytes"]
            added = rows[-1]["computers"] - rows[0]["computers"]
            figures["marginal_bytes_per_computer"] = round(grown / max(1, added))
        figures["stragglers"] = await self.close_many(computers)
        return figures

    async def health(
        self, computers: int, in_flight: int, duration: float, warmup: float
    ) -> dict[str, Any]:
        opened, _, open_errors = await self.open_many(
            self.next_ids(computers, "health"), 64, timeout=60
        )
        latencies: list[float] = []
        errors: Counter = Counter()
        state = {"measuring": False, "stopping": False, "outstanding": 0, "answered": 0}
        drained = self.loop.create_future()

        def on_answer(computer: Computer, message, latency: float) -> None:
            why = self.failed(message)
            if why is None and self.gateway and message["payload"].get("opencodeOk") is not True:
                why = "opencode not ok"
            if state["measuring"]:
                if why is None:
                    latencies.append(latency)
                else:
                    errors[why] += 1
            if state["stopping"] or message is None:
                state["outstanding"] -= 1
                if state["outstanding"] == 0 and not drained.done():
                    drained.set_result(None)
            else:
                computer.request(b"health", b"{}", on_answer)

        for computer in opened:
            for _ in range(in_flight):
                state["outstanding"] += 1
                computer.request(b"health", b"{}", on_answer)
        await asyncio.sleep(warmup)
        opencode_before = await self.opencode_requests()
        meter = Meter(self)
        state["measuring"] = True
        await asyncio.sleep(duration)
        state["measuring"] = False
        answered = len(latencies)
        figures = meter.stop(answered)
        state["stopping"] = True
        opencode_after = await self.opencode_requests()
        if state["outstanding"]:
            await asyncio.wait([drained], timeout=CLOSE_TIMEOUT)
        figures.update(
            computers=len(opened),
            in_flight_per_computer=in_flight,
            concurrency=len(opened) * in_flight,
            open_errors=dict(open_errors),
            errors=dict(errors),
            answered=answered,
            round_trips_per_s=round(answered / figures["wall_s"], 1),
            latency=percentiles(latencies),
            unanswered_at_end=state["outstanding"],
        )
        if opencode_before is not None:
            figures["opencode_requests"] = opencode_after - opencode_before
        figures["stragglers"] = await self.close_many(opened)
        return figures

    async def burst(self, computers: int) -> dict[str, Any]:
        opened, _, open_errors = await self.open_many(
            self.next_ids(computers, "burst"), 64, timeout=60
        )
        if self.gateway:
            # Let the warm-up's probe result go stale: the burst then has to share
            # one request in flight instead of reusing a fresh result.
            await asyncio.sleep(PROBE_FRESH_FOR)
        opencode_before = await self.opencode_requests()
        meter = Meter(self)
        started = perf_counter()
        calls = [computer.call(b"health") for computer in opened]
        sent = perf_counter() - started
        done, not_done = await asyncio.wait(calls, timeout=30)
        figures = meter.stop(len(opened))
        answers = [call.result() for call in done]
        errors = Counter(why for why in (self.failed(a[0]) for a in answers) if why)
        if self.gateway:
            errors.update(
                "opencode not ok"
                for message, _, _ in answers
                if message
                and message.get("ok")
                and message["payload"].get("opencodeOk") is not True
            )
        opencode_after = await self.opencode_requests()
        figures.update(
            computers=len(opened),
            open_errors=dict(open_errors),
            sent_in_ms=round(sent * 1000, 3),
            answered=len(answers) - sum(errors.values()),
            unanswered=len(not_done),
            errors=dict(errors),
            all_answered=len(opened) == computers and not not_done and not errors,
            time_to_last_answer_ms=round((max(a[2] for a in answers) - started) * 1000, 3)
            if answers
            else None,
            latency=percentiles([a[1] for a in answers]),
        )
        if opencode_before is not None:
            figures["opencode_requests"] = opencode_after - opencode_before
        figures["stragglers"] = await self.close_many(opened)
        return figures

    async def ping(self, computers: int, concurrency: int, duration: float) -> dict[str, Any]:
        if not self.gateway:
            return {"skipped": "the bare server has no operator endpoint"}
        opened, _, open_errors = await self.open_many(
            self.next_ids(computers, "ping"), 64, timeout=60
        )
        if not opened:
            return {"skipped": "no computer could connect", "open_errors": dict(open_errors)}
        host = f"{self.host}:{self.port}"
        headers = {"Content-Type": "application/json"}
        if self.admin_token:
            headers["Authorization"] = f"Bearer {self.admin_token}"
        body = b'{"type":"ping","timeoutMs":10000}'
        paths = [f"/computers/{quote(c.trapos_id, safe='')}/requests" for c in opened]

        probe = await self.http()
        try:
            status, answer = await asyncio.wait_for(
                probe.request("POST", paths[0], host, body, headers), 10
            )
        finally:
            probe.close()
        if status != 200:
            await self.close_many(opened)
            return {
                "skipped": f"no operator endpoint POST /computers/{{traposId}}/requests "
                f"(HTTP {status}: {answer[:200].decode('utf-8', 'replace')})",
            }

        latencies: list[float] = []
        errors: Counter = Counter()
        state = {"measuring": True}

        async def client(index: int) -> None:
            http = await self.http()
            try:
                n = index
                while state["measuring"]:
                    path = paths[n % len(paths)]
                    n += concurrency
                    started = perf_counter()
                    status, answer = await asyncio.wait_for(
                        http.request("POST", path, host, body, headers), 15
                    )
                    if status == 200 and loads(answer).get("ok") is True:
                        if state["measuring"]:
                            latencies.append(perf_counter() - started)
                    else:
                        errors[f"HTTP {status}"] += 1
            finally:
                http.close()

        meter = Meter(self)
        clients = [asyncio.ensure_future(client(i)) for i in range(concurrency)]
        await asyncio.sleep(duration)
        state["measuring"] = False
        answered = len(latencies)
        figures = meter.stop(answered)
        results = await asyncio.gather(*clients, return_exceptions=True)
        errors.update(type(r).__name__ for r in results if isinstance(r, BaseException))
        figures.update(
            computers=len(opened),
            http_concurrency=concurrency,
            open_errors=dict(open_errors),
            errors=dict(errors),
            answered=answered,
            pings_per_s=round(answered / figures["wall_s"], 1),
            latency=percentiles(latencies),
            answered_by_computers=sum(c.pings for c in opened),
        )
        figures["stragglers"] = await self.close_many(opened)
        return figures

    async def opws(self, computers: int, concurrency: int, duration: float) -> dict[str, Any]:
        """``ping``'s load through ``/operator``: one WebSocket per client, closed loop."""
        if not self.target.startswith("gateway"):
            return {"skipped": "only the gateway has the operator WebSocket /operator"}
        opened, _, open_errors = await self.open_many(
            self.next_ids(computers, "opws"), 64, timeout=60
        )
        if not opened:
            return {"skipped": "no computer could connect", "open_errors": dict(open_errors)}
        url = f"ws://{self.host}:{self.port}/operator"
        headers = {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else None
        ids = [c.trapos_id.encode() for c in opened]
        message = b'{"id":%d,"traposId":"%b","type":"ping","timeoutMs":10000}'

        async def operator() -> Operator:
            _, client = await ws_connect(
                lambda: Operator(self.loop),
                url,
                websocket_handshake_timeout=OPEN_TIMEOUT,
                enable_auto_pong=False,
                extra_headers=headers,
            )
            return client

        try:
            probe = await operator()
            answer = loads(await asyncio.wait_for(probe.call(message % (0, ids[0])), 10))
            probe.close()
        except Exception as error:
            await self.close_many(opened)
            return {"skipped": f"no operator WebSocket /operator ({type(error).__name__}: {error})"}
        if answer.get("status") != 200:
            await self.close_many(opened)
            return {"skipped": f"/operator answered {str(answer)[:200]}"}

        clients = await asyncio.gather(*(operator() for _ in range(concurrency)))
        latencies: list[float] = []
        errors: Counter = Counter()
        state = {"measuring": True}

        async def client(index: int, socket: Operator) -> None:
            n = index
            while state["measuring"]:
                data = message % (n, ids[n % len(ids)])
                n += concurrency
                started = perf_counter()
                answer = loads(await asyncio.wait_for(socket.call(data), 15))
                if answer.get("status") == 200 and answer.get("ok") is True:
                    if state["measuring"]:
                        latencies.append(perf_counter() - started)
                else:
                    errors[f"status {answer.get('status')}"] += 1

        meter = Meter(self)
        running = [asyncio.ensure_future(client(i, c)) for i, c in enumerate(clients)]
        await asyncio.sleep(duration)
        state["measuring"] = False
        answered = len(latencies)
        figures = meter.stop(answered)
        results = await asyncio.gather(*running, return_exceptions=True)
        errors.update(type(r).__name__ for r in results if isinstance(r, BaseException))
        for socket in clients:
            socket.close()
        await asyncio.wait([c.closed for c in clients], timeout=CLOSE_TIMEOUT)
        figures.update(
            computers=len(opened),
            operator_sockets=concurrency,
            open_errors=dict(open_errors),
            errors=dict(errors),
            answered=answered,
            requests_per_s=round(answered / figures["wall_s"], 1),
            latency=percentiles(latencies),
            answered_by_computers=sum(c.pings for c in opened),
        )
        figures["stragglers"] = await self.close_many(opened)
        return figures

    async def slowreader(
        self, computers: int, in_flight: int, senders: int, request_bytes: int, duration: float
    ) -> dict[str, Any]:
        """
        One computer stops reading while operators send it large requests; the
        others keep asking for health.  Issue 6: the gateway's memory stays
        bounded and the others are not slowed.
        """
        if not self.gateway:
            return {"skipped": "the bare server has no operator endpoint"}
        [(slow, _)] = [await self.open_computer(self.next_ids(1, "slow")[0])]
        slow.transport.underlying_transport.pause_reading()
        opened, _, open_errors = await self.open_many(
            self.next_ids(computers, "busy"), 64, timeout=60
        )
        host = f"{self.host}:{self.port}"
        headers = {"Content-Type": "application/json"}
        if self.admin_token:
            headers["Authorization"] = f"Bearer {self.admin_token}"
        path = f"/computers/{quote(slow.trapos_id, safe='')}/requests"
        body = orjson.dumps(
            {"type": "big", "payload": {"pad": "x" * request_bytes}, "timeoutMs": 2000}
        )
        statuses: Counter = Counter()
        latencies: list[float] = []
        state = {"running": True, "rss_peak": self.rss()}
        rss_before = state["rss_peak"]

        async def sender() -> None:
            http = await self.http()
            try:
                while state["running"]:
                    status, _ = await asyncio.wait_for(
                        http.request("POST", path, host, body, headers), 15
                    )
                    statuses[f"HTTP {status}"] += 1
            finally:
                http.close()

        async def asker(computer: Computer) -> None:
            while state["running"]:
                message, latency, _ = await asyncio.wait_for(computer.call(b"health"), 15)
                if self.failed(message) is None:
                    latencies.append(latency)

        async def watch_rss() -> None:
            while state["running"]:
                state["rss_peak"] = max(state["rss_peak"], self.rss())
                await asyncio.sleep(0.1)

        meter = Meter(self)
        tasks = [asyncio.ensure_future(sender()) for _ in range(senders)]
        tasks += [asyncio.ensure_future(asker(c)) for c in opened for _ in range(in_flight)]
        tasks.append(asyncio.ensure_future(watch_rss()))
        await asyncio.sleep(duration)
        state["running"] = False
        figures = meter.stop(len(latencies))
        results = await asyncio.gather(*tasks, return_exceptions=True)
        errors = Counter(type(r).__name__ for r in results if isinstance(r, BaseException))
        figures.update(
            computers=len(opened),
            open_errors=dict(open_errors),
            errors=dict(errors),
            request_bytes=request_bytes,
            statuses=dict(statuses),
            rss_before_bytes=rss_before,
            rss_peak_bytes=state["rss_peak"],
            rss_growth_mib=round((state["rss_peak"] - rss_before) / 2**20, 1),
            latency=percentiles(latencies),
            answered=len(latencies),
        )
        slow.transport.underlying_transport.resume_reading()
        figures["stragglers"] = await self.close_many([*opened, slow])
        return figures

    async def churn(
        self, cycles: int, concurrency: int, checkpoint: int, max_seconds: float
    ) -> dict[str, Any]:
        ids = iter(self.next_ids(cycles, "churn"))
        deadline = perf_counter() + max_seconds
        errors: Counter = Counter()
        latencies: list[float] = []
        state: dict[str, Any] = {"done": 0, "checkpoint_rss": None}
        # RSS every ``checkpoint`` cycles: a leak is a slope, a warm-up a step.
        curve: list[tuple[int, int]] = []
        rss_start = self.rss()
        registered_start = await self.registered()

        async def worker() -> None:
            for trapos_id in ids:
                if perf_counter() > deadline:
                    errors["time bound reached"] += 1
                    return
                started = perf_counter()
                computer = None
                try:
                    computer, _ = await asyncio.wait_for(
                        self.open_computer(trapos_id), OPEN_TIMEOUT
                    )
                    message, _, _ = await asyncio.wait_for(computer.call(b"health"), 10)
                    why = self.failed(message)
                    if why:
                        errors[why] += 1
                    computer.close()
                    await asyncio.wait_for(asyncio.shield(computer.closed), CLOSE_TIMEOUT)
                except Exception as error:  # counted, never fatal
                    self.count_error(errors, error)
                    if computer is not None and computer.transport is not None:
                        computer.transport.disconnect(graceful=False)
                    continue
                latencies.append(perf_counter() - started)
                state["done"] += 1
                if state["done"] % checkpoint == 0:
                    curve.append((state["done"], self.rss()))
                    if state["done"] == checkpoint:
                        state["checkpoint_rss"] = curve[-1][1]

        meter = Meter(self)
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        done = state["done"]
        figures = meter.stop(done)
        # The server forgets a computer when its connection is lost, a moment
        # after our side sees the close: wait (bounded) for the registry to empty.
        registered_end = await self.registered()
        waited = perf_counter() + 10
        while registered_end and perf_counter() < waited:
            await asyncio.sleep(0.05)
            registered_end = await self.registered()
        rss_end = self.rss()
        checkpoint_rss = state["checkpoint_rss"]
        figures.update(
            cycles=cycles,
            completed=done,
            concurrency=concurrency,
            errors=dict(errors),
            cycles_per_s=round(done / figures["wall_s"], 1),
            cycle=percentiles(latencies),
            registered_start=registered_start,
            registered_end=registered_end,
            rss_start_bytes=rss_start,
            rss_checkpoint_bytes=checkpoint_rss,
            checkpoint_cycles=checkpoint,
            rss_end_bytes=rss_end,
            rss_curve=curve,
        )
        if checkpoint_rss:
            figures["rss_growth_since_checkpoint_pct"] = round(
                (rss_end - checkpoint_rss) / checkpoint_rss * 100, 2
            )
        return figures


SCENARIOS = ("connect", "idle", "health", "burst", "ping", "opws", "churn", "slowreader")


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    generator = Generator(spec)
    await generator.warm_up()
    results: dict[str, Any] = {}
    for scenario in spec["scenarios"]:
        name = scenario.pop("name")
        started = perf_counter()
        try:
            results[name] = await getattr(generator, name)(**scenario)
        except Exception as error:
            logging.exception("scenario %s failed", name)
            results[name] = {"failed": f"{type(error).__name__}: {error}"}
        results[name]["scenario_s"] = round(perf_counter() - started, 2)
        generator.log(f"{name} done in {results[name]['scenario_s']} s")
    return results


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    spec = orjson.loads(argv[0])
    fd_limit = proc.raise_fd_limit()
    try:
        import uvloop
    except ImportError:
        results = asyncio.run(run(spec))
        loop_name = "asyncio"
    else:
        results = uvloop.run(run(spec))
        loop_name = f"uvloop {uvloop.__version__}"
    output = {"scenarios": results, "fd_limit": fd_limit, "event_loop": loop_name}
    sys.stdout.write(orjson.dumps(output).decode() + "\n")


if __name__ == "__main__":
    main()
