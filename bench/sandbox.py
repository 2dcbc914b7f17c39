"""
The sandbox figures (SPEC §9): exec round trips and file transfers, end to end.

    python -m bench.sandbox [--execs N] [--output FILE]

One real gateway (in this process, on 127.0.0.1:0) and one computer of the
CraftOS harness (``tests/harness/craftos.py``: real Lua 5.2 running the real
``lua/`` client, its disk sized for a 1 MiB file) on the same reactor.

- exec round trip: ``POST /computers/{id}/execute`` of a program that prints
  one line (``echo``), over HTTP keep-alive, one at a time: p50 and p99 from
  the request to the last NDJSON line.
- file transfer: ``trapsandbox-ctl put`` then ``get`` of 64 KiB, 300 KB and
  1 MiB, each as a whole command (process start included), in KiB/s; the file
  read back is compared with the one written.

The computer is the test harness's (``bench.harness``).  Its figures are the
harness's, not a Minecraft server's: a real computer adds the server's tick
(50 ms) to a round trip.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import treq
from twisted.internet import defer, task, threads
from twisted.web.client import HTTPConnectionPool

from bench import harness
from trapsandbox import limits

CTL = str(Path(sys.executable).parent / "trapsandbox-ctl")
SIZES = (64 * 1024, 300_000, 1024 * 1024)

# Every operator POST is JSON (SPEC §4: 415 otherwise).
JSON = {"Content-Type": "application/json"}


async def run(reactor, args: argparse.Namespace) -> dict:
    gateway, port = harness.start_gateway(reactor)
    computer = harness.computer(
        port, "bench", "exec,eval,fs.read,fs.write,screen", capacity=4 * limits.MAX_FILE_BYTES
    )
    computer.write_file("/echo.lua", "print(...)")
    await harness.connected(computer)
    base = f"http://127.0.0.1:{port}/computers/1%3Abench"
    pool = HTTPConnectionPool(reactor, persistent=True)
    results: dict = {}
    try:
        times = []
        body = orjson.dumps({"command": "echo", "args": ["hello"]})
        for _ in range(args.execs):
            started = time.perf_counter()
            response = await treq.post(base + "/execute", data=body, headers=JSON, pool=pool)
            lines = (await treq.content(response)).splitlines()
            times.append(time.perf_counter() - started)
            assert orjson.loads(lines[-1])["exitCode"] == 0, lines
            assert orjson.loads(lines[0]) == {"type": "stdout_delta", "data": "hello\n"}, lines
        results["exec"] = {
            "count": len(times),
            "p50_ms": round(harness.percentile(times, 0.5) * 1000, 2),
            "p99_ms": round(harness.percentile(times, 0.99) * 1000, 2),
        }
        env = {**os.environ, "TRAPSANDBOX_URL": f"http://127.0.0.1:{port}"}
        work = Path(tempfile.mkdtemp(prefix="trapsandbox-bench-files-"))
        results["files"] = []
        for size in SIZES:
            data = os.urandom(size)
            local, back = work / f"up-{size}", work / f"down-{size}"
            local.write_bytes(data)
            put = await _timed(reactor, [CTL, "put", "1:bench", str(local), "/f.bin"], env)
            get = await _timed(reactor, [CTL, "get", "1:bench", "/f.bin", str(back)], env)
            assert back.read_bytes() == data, f"{size} bytes came back different"
            results["files"].append(
                {
                    "bytes": size,
                    "put_s": round(put, 3),
                    "get_s": round(get, 3),
                    "put_kib_s": round(size / 1024 / put),
                    "get_kib_s": round(size / 1024 / get),
                }
            )
    finally:
        await pool.closeCachedConnections()
        await computer.shutdown()
        await gateway.stopService()
    return results


async def _timed(reactor, argv: list[str], env: dict) -> float:
    """Seconds ``argv`` took; it runs in a thread so the reactor serves it meanwhile."""
    started = time.perf_counter()
    done = await threads.deferToThread(subprocess.run, argv, env=env, capture_output=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{argv[1]} failed: {done.stderr.decode()}")
    return elapsed


async def report(reactor, args: argparse.Namespace) -> None:
    outcome = await run(reactor, args)
    harness.show(outcome, args.output)
    biggest = [f for f in outcome["files"] if f["bytes"] == SIZES[-1]][0]
    print(
        f"exec p50 {outcome['exec']['p50_ms']} ms (target <= 20), "
        f"p99 {outcome['exec']['p99_ms']} ms; 1 MiB put {biggest['put_s']} s, "
        f"get {biggest['get_s']} s (target <= 2 each)"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sandbox", description=__doc__)
    parser.add_argument("--execs", type=int, default=200, help="exec round trips (200)")
    parser.add_argument("--output", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    # react() exits the process when report() is done.
    task.react(lambda reactor: defer.ensureDeferred(report(reactor, args)))


if __name__ == "__main__":
    main()
