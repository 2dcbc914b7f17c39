"""
What strangers cost a real gateway (SPEC §4 "Nothing is buffered for a stranger").

    python -m bench.strangers [--connections 150] [--path /mcp] [--body 2097152]

Starts ``twistd -n trapsandbox`` with an admin token on a loopback port, then
opens N connections without a token, each sending an operator POST's head
and most of a large body, and stalling there.  Prints the daemon's RSS before
and after, and how many connections the daemon still held open.  Before the
head decided (issue 19, finding 3), each body was buffered: 150 connections
took the daemon from ~63 to ~362 MB.  Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

from bench import proc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TWISTD = os.path.join(os.path.dirname(sys.executable), "twistd")
TOKEN = "strangers-bench-token"


def _start() -> tuple[subprocess.Popen, int]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SANDBOX_", "OPENCODE_"))},
        "PYTHONPATH": REPO,
        "OPENCODE_URL": "",
        "SANDBOX_ADMIN_TOKEN": TOKEN,
    }
    log = tempfile.NamedTemporaryFile(prefix="bench-strangers-", suffix=".log", delete=False)
    argv = [TWISTD, "-n", "--pidfile=", "trapsandbox", "--port", "tcp:0:interface=127.0.0.1"]
    daemon = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with open(log.name, encoding="utf-8", errors="replace") as f:
            found = re.search(r"listening on 127\.0\.0\.1:(\d+)", f.read())
        if found:
            return daemon, int(found.group(1))
        time.sleep(0.05)
    daemon.kill()
    raise SystemExit(f"twistd did not start; see {log.name}")


def _stall(port: int, path: str, body: int, count: int) -> list[socket.socket]:
    """``count`` connections, each sending the head and all but 1 KiB of the body."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {body}\r\n\r\n"
    ).encode()
    chunk = b"x" * 65536
    sockets = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port))
        s.setblocking(False)
        sockets.append([s, head + chunk, len(head) + body - 1024])
    # Write to every connection as far as the daemon reads, until each has sent
    # its share or the daemon stopped reading it (closed, or its buffers are full).
    deadline = time.monotonic() + 30
    active = list(sockets)
    while active and time.monotonic() < deadline:
        progress = False
        for entry in list(active):
            s, pending, left = entry
            try:
                sent = s.send(pending[: max(0, min(len(pending), left))])
            except BlockingIOError:
                continue
            except OSError:
                active.remove(entry)  # refused and closed by the daemon
                continue
            progress = progress or sent > 0
            entry[2] = left - sent
            entry[1] = pending[sent:] or chunk
            if entry[2] <= 0:
                active.remove(entry)
        if not progress:
            time.sleep(0.05)
    return [entry[0] for entry in sockets]


def _open_connections(pid: int) -> int:
    """TCP connections the daemon holds (its socket descriptors, less the listener)."""
    sockets = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                sockets += 1
        except OSError:
            pass
    return sockets - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=150)
    parser.add_argument("--path", default="/computers/7%3Abase/requests")
    parser.add_argument("--body", type=int, default=2 * 1024 * 1024 - 1)
    args = parser.parse_args()
    proc.raise_fd_limit()
    daemon, port = _start()
    try:
        time.sleep(1.0)  # start-up settles
        before = proc.rss_bytes(daemon.pid)
        sockets = _stall(port, args.path, args.body, args.connections)
        time.sleep(2.0)  # what was sent is read
        after = proc.rss_bytes(daemon.pid)
        held = _open_connections(daemon.pid)
        print(
            f"{args.path}: {args.connections} strangers, {args.body} byte bodies: "
            f"RSS {before / 1e6:.0f} -> {after / 1e6:.0f} MB; "
            f"{held} connections still open in the daemon"
        )
        for s in sockets:
            s.close()
    finally:
        daemon.terminate()
        daemon.wait(10)


if __name__ == "__main__":
    main()
