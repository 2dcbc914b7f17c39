"""
The attacks of docs/security.md against a real ``twistd -n trapsandbox``, counted.

    .venv/bin/python -m bench.probe [--drip-seconds 45] [--output FILE]

Each probe is what an attacker would send (a web page in the operator's
browser, a neighbour behind the same address, a stranger without a token),
and each counts what got through: requests that reached a computer, answers
that were not refusals, memory the gateway kept for strangers.  Two gateways
are started on 127.0.0.1 (port 0): one as the README's same-machine setup (a
password, no admin token: loopback is the admin) and one with an admin token.
Every connection stays on loopback and every loop is bounded; the gateways are
stopped at the end.  The figures go to stdout as a table (and JSON with
``--output``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from picows import WSListener, WSMsgType, ws_connect

from bench import proc
from bench.run import BIN, Child, _clean_env

PASSWORD = "probe-password-0123456789"
ADMIN = "probe-admin-token"
EVIL = b"http://evil.example"


class Computer(WSListener):
    """A computer that counts every request the gateway sends it and answers ok."""

    def __init__(self) -> None:
        self.transport = None
        self.received: list[str] = []
        self.hello: asyncio.Future = asyncio.get_running_loop().create_future()
        self.closed: asyncio.Future = asyncio.get_running_loop().create_future()

    def on_ws_connected(self, transport) -> None:
        self.transport = transport

    def on_ws_frame(self, transport, frame) -> None:
        if frame.msg_type == WSMsgType.CLOSE:
            if not self.closed.done():
                self.closed.set_result(frame.get_close_code())
            return
        if frame.msg_type != WSMsgType.TEXT:
            return
        message = orjson.loads(frame.get_payload_as_bytes())
        if message.get("event") == "gateway_response" and message.get("type") == "hello":
            if not self.hello.done():
                self.hello.set_result(message)
        elif message.get("event") == "gateway_request":
            self.received.append(message["type"])
            reply = {
                "event": "computer_response",
                "traposSenderId": "7:base",
                "messageId": message["messageId"],
                "type": message["type"],
                "ok": True,
                "payload": {},
            }
            transport.send(WSMsgType.TEXT, orjson.dumps(reply))

    def on_ws_disconnected(self, transport) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        if not self.hello.done():
            self.hello.set_result(None)

    def send_hello(self, secret: str, trapos_id: str = "7:base") -> None:
        frame = {
            "event": "computer_request",
            "traposSenderId": trapos_id,
            "messageId": "h",
            "type": "hello",
            "payload": {
                "traposId": trapos_id,
                "secret": secret,
                "capabilities": ["exec", "eval", "fs.read", "fs.write", "screen"],
            },
        }
        self.transport.send(WSMsgType.TEXT, orjson.dumps(frame))


async def computer(port: int, secret: str, origin: bytes | None = None) -> Computer | None:
    """A computer connected and past hello, or None when the gateway refused it."""
    headers = {"Origin": origin.decode()} if origin else None
    try:
        _, listener = await ws_connect(
            Computer, f"ws://127.0.0.1:{port}/gateway", extra_headers=headers
        )
    except Exception:
        return None
    listener.send_hello(secret)
    answer = await asyncio.wait_for(listener.hello, 10)
    return listener if answer and answer.get("ok") else None


async def http(port: int, head: bytes, body: bytes = b"", bound: float = 10) -> tuple[int, bytes]:
    """One request on a fresh connection: its status (0: closed unanswered) and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + body)
        data = await asyncio.wait_for(reader.read(1 << 20), bound)
        status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0
        return status, data.partition(b"\r\n\r\n")[2]
    except (TimeoutError, ConnectionError):
        return 0, b""
    finally:
        writer.close()


def post(path: str, body: bytes, content_type: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
        b"%s\r\n" % (path.encode(), content_type, len(body), extra)
    )


def start(name: str, folder: Path, **env: str) -> Child:
    argv = [
        str(BIN / "twistd"),
        "-n",
        "--pidfile=",
        "trapsandbox",
        "--port",
        "tcp:0:interface=127.0.0.1",
    ]
    state = folder / f"{name}-state"
    child = Child(
        name,
        argv,
        folder / f"{name}.log",
        None,
        env=_clean_env(OPENCODE_URL="", SANDBOX_STATE_DIR=str(state), **env),
    )
    child.wait_listening()
    return child


async def browser(port: int) -> dict[str, Any]:
    """A web page the operator visits, and a DNS rebinding, against the loopback admin."""
    target = await computer(port, PASSWORD)
    assert target is not None, "the probe's own computer was refused"
    bodies = {
        "/computers/7%3Abase/execute": {"command": "rm", "args": ["-rf", "/"]},
        "/computers/7%3Abase/eval": {"code": "return 1"},
        "/computers/7%3Abase/write-file": {
            "path": "/startup.lua",
            "content": base64.b64encode(b"print('owned')").decode(),
            "encoding": "base64",
        },
        "/computers/7%3Abase/requests": {"type": "ping"},
        "/mcp": {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "run_command", "arguments": {"command": "rm"}},
        },
    }
    attempts = answered = 0
    for path, obj in bodies.items():
        body = orjson.dumps(obj)
        for content_type, extra in (
            (b"text/plain", b"Origin: " + EVIL + b"\r\n"),
            (b"application/json", b"Origin: " + EVIL + b"\r\n"),
            (b"text/plain", b""),
        ):
            attempts += 1
            status, _ = await http(port, post(path, body, content_type, extra), body)
            answered += status == 200
    rebinding = 0
    for path in (b"/computers", b"/metrics"):
        attempts += 1
        status, _ = await http(port, b"GET %s HTTP/1.1\r\nHost: evil.example:4444\r\n\r\n" % path)
        rebinding += status == 200
    replaced = 0
    attempts += 1
    intruder = await computer(port, PASSWORD, origin=EVIL)
    replaced += intruder is not None
    return {
        "attempts": attempts,
        "answered_200": answered + rebinding + replaced,
        "requests_reaching_the_computer": len(target.received),
    }


async def lockout(port: int) -> dict[str, Any]:
    """A neighbour's wrong secrets and tokens, then the right ones from the same address."""
    for _ in range(7):
        await computer(port, "wrong")
    right_hello = await computer(port, PASSWORD)
    statuses = []
    for _ in range(7):
        statuses.append(
            (
                await http(
                    port,
                    b"GET /computers HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Authorization: Bearer wrong\r\n\r\n",
                )
            )[0]
        )
    right_token, _ = await http(
        port,
        b"GET /computers HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
        + ADMIN.encode()
        + b"\r\n\r\n",
    )
    return {
        "wrong_attempts": 14,
        "right_hello_admitted": right_hello is not None,
        "right_token_status": right_token,
    }


async def strangers(port: int, pid: int, connections: int) -> dict[str, Any]:
    """Strangers without a token sending most of a 2 MiB body, then stalling."""
    before = proc.rss_bytes(pid)
    writers = []
    answered_before_body = 0
    size = 2 * 1024 * 1024
    sent = size - 4096
    chunk = b"x" * 65536
    for i in range(connections):
        path = "/mcp" if i % 2 else "/computers/7%3Abase/requests"
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = (
            b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (path.encode(), size)
        )
        writer.write(head)
        writers.append((reader, writer))
        for _ in range(sent // len(chunk)):
            if writer.is_closing():
                break
            writer.write(chunk)
            try:
                await asyncio.wait_for(writer.drain(), 2)
            except (TimeoutError, ConnectionError):
                break
    await asyncio.sleep(1)  # let the gateway read what the kernel holds (a figure, not a test)
    peak = proc.rss_bytes(pid)
    held = 0
    for reader, _ in writers:
        try:
            data = await asyncio.wait_for(reader.read(4096), 0.2)
        except TimeoutError:
            held += 1  # no answer, not closed: the gateway still holds it
            continue
        except ConnectionError:
            data = b""
        answered_before_body += data.startswith(b"HTTP/1.1 4")
    for _, writer in writers:
        writer.close()
    return {
        "connections": connections,
        "refusals_read": answered_before_body,
        "still_held_by_the_gateway": held,
        "rss_before_mb": round(before / 2**20, 1),
        "rss_peak_mb": round(peak / 2**20, 1),
        "rss_growth_mb": round((peak - before) / 2**20, 1),
    }


async def drip(port: int, seconds: float) -> dict[str, Any]:
    """A head dripped a byte every 20 s: how long the gateway keeps the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    head = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    closed_after = None
    for byte in head:
        writer.write(bytes([byte]))
        try:
            data = await asyncio.wait_for(reader.read(4096), 20)
        except TimeoutError:
            if time.monotonic() - started > seconds:
                break
            continue
        closed_after = time.monotonic() - started
        break
    writer.close()
    return {
        "watched_s": seconds,
        "closed_after_s": None if closed_after is None else round(closed_after, 1),
        "answer": data[:40].decode("latin-1") if closed_after is not None else None,
    }


async def echo(port: int) -> dict[str, Any]:
    """A 1.9 MB ``computer`` argument: how much of it comes back (the log is read at the end)."""
    huge = "x" * 1_900_000
    body = orjson.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "read_screen", "arguments": {"computer": huge}},
        }
    )
    status, answer = await http(
        port, post("/mcp", body, b"application/json", b"Accept: application/json\r\n"), body
    )
    return {
        "argument_bytes": len(huge),
        "status": status,
        "answer_bytes": len(answer),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="trapsandbox-probe-"))
    same_machine = start("same-machine", folder, SANDBOX_PASSWORD=PASSWORD)
    with_token = start("with-token", folder, SANDBOX_PASSWORD=PASSWORD, SANDBOX_ADMIN_TOKEN=ADMIN)
    try:
        dripping = asyncio.ensure_future(drip(with_token.port, args.drip_seconds))
        results = {
            "browser": await browser(same_machine.port),
            "echo": await echo(same_machine.port),
            "lockout": await lockout(with_token.port),
            "strangers": await strangers(with_token.port, with_token.pid, args.connections),
            "drip": await dripping,
        }
    finally:
        same_machine.stop()
        with_token.stop()
    results["gateway_errors"] = same_machine.errors() + with_token.errors()
    lines = same_machine.log.read_text(errors="replace").splitlines()
    results["echo"]["longest_log_line"] = max(map(len, lines), default=0)
    return results


def run(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.probe", description=__doc__)
    parser.add_argument("--connections", type=int, default=150)
    parser.add_argument("--drip-seconds", type=float, default=45.0)
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    proc.raise_fd_limit()
    results = asyncio.run(main(args))
    text = orjson.dumps(results, option=orjson.OPT_INDENT_2).decode()
    print(text)
    if args.output:
        Path(args.output).write_text(text)
    sys.exit(0)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    run()
