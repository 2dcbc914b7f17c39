"""
SPEC §15's snapshot figures, two ways.

The stores in-process: storage after 10 snapshots of a 1 MiB disk of 100 files with 5 % of
them changed each time, and the time to take one (the store's part: latest, missing,
put_content, commit), to list, and to get and plan a restore; no computer is involved::

    python -m bench.snapshots [--redis]   # --redis: also a redis-server of its own

End to end, through a gateway's HTTP routes and a computer running the real Lua client: 100
files of 10 KiB (1 MiB) written to ``/bench-snapshots`` on it, then the first snapshot, a
snapshot with nothing changed, a restore of 10 changed files (which takes a snapshot of the
current state first, as every restore does), and 10 snapshots with 5 % of the files changed
each; the bench's files are deleted at the end (its snapshots stay, pruned as any)::

    python -m bench.snapshots --computer
        # a gateway in this process, a computer on the CraftOS harness (real Lua 5.2)
    python -m bench.snapshots --computer 7:base --url http://127.0.0.1:4444 [--token T]
        # a running gateway (--token, or SANDBOX_ADMIN_TOKEN; none on loopback) and a
        # connected computer that allowed fs.read and fs.write: real CraftOS-PC, say

The "first" snapshot is a first only for the bench's files (a computer with earlier
snapshots sends only what differs from its latest, and the bench's files are new each run).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import random
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import time
from urllib.parse import quote

import orjson
import treq
from twisted.internet import task
from twisted.internet.defer import ensureDeferred
from twisted.web.client import HTTPConnectionPool

from trapsandbox import limits
from trapsandbox.snapshots import changes
from trapsandbox.snapshots.redisstore import RedisStore
from trapsandbox.snapshots.sqlitestore import SqliteStore

FILES, FILE_BYTES, SNAPSHOTS, CHANGED = 100, 10 * 1024 + 246, 10, 5
ACCOUNT, COMPUTER = "bench", "1:"
HARNESS = "harness"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def take(store, disk: dict[str, bytes], times: dict[str, int]) -> str:
    latest = await store.latest(ACCOUNT, COMPUTER)
    listing = {p: (len(d), times[p]) for p, d in disk.items()}
    fetched = changes.to_fetch(latest, listing)
    hashes = {p: sha(disk[p]) for p in fetched}
    absent = await store.missing(ACCOUNT, hashes.values())
    for path in fetched:
        if hashes[path] in absent:
            await store.put_content(ACCOUNT, hashes[path], disk[path])
    files = {
        p: {"size": s, "modified": m, "sha256": hashes.get(p) or latest[p].sha256}
        for p, (s, m) in listing.items()
    }
    return await store.commit(ACCOUNT, COMPUTER, files, "ask")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


async def measure(name: str, store, size_of) -> dict:
    rng = random.Random(22)
    disk = {f"/dir{n % 5}/file{n}.lua": rng.randbytes(FILE_BYTES) for n in range(FILES)}
    times = dict.fromkeys(disk, 1)
    takes = []
    for n in range(SNAPSHOTS):
        if n:
            for path in rng.sample(sorted(disk), CHANGED):
                disk[path] = rng.randbytes(FILE_BYTES)
                times[path] += 1
        started = time.perf_counter()
        await take(store, disk, times)
        takes.append(time.perf_counter() - started)
    content_bytes = FILES * FILE_BYTES + (SNAPSHOTS - 1) * CHANGED * FILE_BYTES
    started = time.perf_counter()
    await take(store, disk, times)
    unchanged = time.perf_counter() - started
    started = time.perf_counter()
    listed = await store.list(ACCOUNT, COMPUTER)
    listing = time.perf_counter() - started
    started = time.perf_counter()
    target = (await store.get(ACCOUNT, COMPUTER, listed[-1].id)).files
    current = (await store.get(ACCOUNT, COMPUTER, listed[0].id)).files
    plan = changes.restore_plan(target, current)
    contents = [await store.content(ACCOUNT, digest) for _, digest in plan.write]
    restoring = time.perf_counter() - started
    figures = {
        "backend": name,
        "disk bytes": sum(map(len, disk.values())),
        "content bytes held": content_bytes,
        "stored bytes after 10": await size_of(),
        "first take": ms(takes[0]),
        "take, 5 changed (median)": ms(sorted(takes[1:])[len(takes[1:]) // 2]),
        "take, nothing changed": ms(unchanged),
        "list (11)": ms(listing),
        "get 2 + restore plan + read content": ms(restoring),
        "restore writes": len(plan.write),
        "content bytes read": sum(map(len, contents)),
    }
    await store.close()
    return figures


async def sqlite(reactor) -> dict:
    directory = tempfile.mkdtemp(prefix="bench-snapshots-")
    try:
        store = await SqliteStore.open(directory, reactor)
        path = os.path.join(directory, limits.SNAPSHOTS_FILE_NAME)

        async def size_of() -> str:
            # The write-ahead log holds recent pages until a checkpoint folds them in.
            with_wal = sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))
            db = sqlite3.connect(path)
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            db.close()
            return f"{os.path.getsize(path)} (with its WAL before a checkpoint: {with_wal})"

        return await measure("sqlite", store, size_of)
    finally:
        shutil.rmtree(directory)


async def redis(reactor) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    server = subprocess.Popen(argv + ["--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        store = await RedisStore.connect(f"redis://127.0.0.1:{port}/0", reactor).wait_connected(5)
        base = await _used_memory(store)

        async def size_of() -> str:
            return f"{await _used_memory(store) - base} (used_memory grew by)"

        return await measure("redis", store, size_of)
    finally:
        server.terminate()
        server.wait(10)


async def _used_memory(store: RedisStore) -> int:
    info = (await store._call("execute_command", "INFO", "memory")).decode()
    return int(info.split("used_memory:")[1].split()[0])


# -- End to end: a gateway's HTTP routes and a computer ------------------------------------

BENCH_DIR = "/bench-snapshots"
RESTORED = 10  # files changed before the timed restore


class Gateway:
    """The §15 routes (and write-file, delete-file) of one computer on a running gateway."""

    def __init__(self, reactor, url: str, token: str | None, trapos_id: str) -> None:
        self.base = f"{url.rstrip('/')}/computers/{quote(trapos_id, safe='')}"
        self.headers = {"Content-Type": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.pool = HTTPConnectionPool(reactor, persistent=True)

    async def call(self, method: str, path: str, body: object = None) -> dict:
        data = None if body is None else orjson.dumps(body)
        response = await treq.request(
            method, self.base + path, data=data, headers=self.headers, pool=self.pool
        )
        answer = orjson.loads(await treq.content(response))
        if response.code != 200 or not answer.get("ok"):
            raise RuntimeError(f"{method} {path}: {response.code} {answer}")
        return answer

    async def write(self, path: str, data: bytes) -> None:
        content = base64.b64encode(data).decode()
        await self.call(
            "POST", "/write-file", {"path": path, "content": content, "encoding": "base64"}
        )

    async def timed(self, method: str, path: str) -> tuple[float, dict]:
        started = time.perf_counter()
        answer = await self.call(method, path, {} if method == "POST" else None)
        return time.perf_counter() - started, answer


async def end_to_end(gateway: Gateway, store_bytes=None) -> dict:
    """The figures through ``gateway``; ``store_bytes``: how to read the store's size, if
    the store is at hand (the harness run)."""
    rng = random.Random(22)
    paths = [f"{BENCH_DIR}/dir{n % 5}/file{n}.lua" for n in range(FILES)]
    try:
        for path in paths:
            await gateway.write(path, rng.randbytes(FILE_BYTES))
        first_s, first = await gateway.timed("POST", "/snapshots")
        unchanged_s, unchanged = await gateway.timed("POST", "/snapshots")
        for path in rng.sample(paths, RESTORED):
            await gateway.write(path, rng.randbytes(FILE_BYTES))
        restore_s, restored = await gateway.timed("POST", f"/snapshots/{first['id']}/restore")
        takes = []
        for _ in range(SNAPSHOTS):
            for path in rng.sample(paths, CHANGED):
                await gateway.write(path, rng.randbytes(FILE_BYTES))
            took, _ = await gateway.timed("POST", "/snapshots")
            takes.append(took)
        listed = (await gateway.call("GET", "/snapshots"))["snapshots"]
    finally:
        for path in paths:
            await gateway.call("POST", "/delete-file", {"path": path})
        await gateway.pool.closeCachedConnections()
    return {
        "bench files": f"{FILES} x {FILE_BYTES} bytes = {FILES * FILE_BYTES}",
        "first snapshot": f"{ms(first_s)} ({first['files']} files, {first['bytes']} bytes, "
        f"{first['fetched']} fetched)",
        "nothing changed": f"{ms(unchanged_s)} ({unchanged['fetched']} fetched)",
        f"restore of {RESTORED} changed files": f"{ms(restore_s)} "
        f"({len(restored['written'])} written, {len(restored['deleted'])} deleted)",
        f"take, {CHANGED} changed (median of {SNAPSHOTS})": ms(sorted(takes)[len(takes) // 2]),
        "snapshots listed": len(listed),
        f"store bytes after {SNAPSHOTS} more": "the store is on the gateway (its state "
        "directory's snapshots.sqlite3, or Redis)"
        if store_bytes is None
        else store_bytes(),
    }


async def on_harness(reactor) -> dict:
    """``end_to_end`` on a gateway in this process and a computer of the CraftOS harness."""
    from bench import harness

    state = tempfile.mkdtemp(prefix="bench-snapshots-state-")
    service, port, snapshots = harness.start_gateway(reactor, state, with_snapshots=True)
    computer = harness.computer(port, "bench", "fs.read,fs.write", capacity=8 * 1024 * 1024)
    try:
        await snapshots.ready()
        await harness.connected(computer)
        path = os.path.join(state, limits.SNAPSHOTS_FILE_NAME)

        def store_bytes() -> str:
            db = sqlite3.connect(path)
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            db.close()
            return f"{os.path.getsize(path)} (SQLite, checkpointed)"

        gateway = Gateway(reactor, f"http://127.0.0.1:{port}", None, "1:bench")
        figures = {"where": "gateway in-process, computer on the CraftOS harness"}
        figures.update(await end_to_end(gateway, store_bytes))
        return figures
    finally:
        await computer.shutdown()
        await service.stopService()
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(computer.root, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.snapshots",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--redis", action="store_true", help="also the Redis store")
    parser.add_argument(
        "--computer",
        nargs="?",
        const=HARNESS,
        help="end to end: alone, on the harness; with a traposId, that computer on --url",
    )
    parser.add_argument("--url", default=limits.DEFAULT_CTL_URL, help="a running gateway")
    parser.add_argument(
        "--token",
        default=os.environ.get("SANDBOX_ADMIN_TOKEN") or None,
        help="its operator bearer token (env SANDBOX_ADMIN_TOKEN)",
    )
    args = parser.parse_args(argv)

    async def run(reactor) -> None:
        if args.computer == HARNESS:
            results = [await on_harness(reactor)]
        elif args.computer:
            gateway = Gateway(reactor, args.url, args.token, args.computer)
            results = [{"where": f"{args.computer} on {args.url}", **await end_to_end(gateway)}]
        else:
            results = [await sqlite(reactor)]
            if args.redis:
                results.append(await redis(reactor))
        for figures in results:
            print(orjson.dumps(figures, option=orjson.OPT_INDENT_2).decode())

    task.react(lambda reactor: ensureDeferred(run(reactor)))


if __name__ == "__main__":
    main()
