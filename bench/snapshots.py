"""
The snapshot stores in-process (SPEC §15): storage after 10 snapshots of a 1 MiB disk of
100 files with 5 % of them changed each time, and the time to take one (the store's part:
latest, missing, put_content, commit), to list, and to get and plan a restore::

    python -m bench.snapshots [--redis]   # --redis: also a redis-server of its own

No computer is involved: this is the store's share of SPEC §15's targets.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import time

import orjson
from twisted.internet import task
from twisted.internet.defer import ensureDeferred

from trapsandbox import limits
from trapsandbox.snapshots import changes
from trapsandbox.snapshots.redisstore import RedisStore
from trapsandbox.snapshots.sqlitestore import SqliteStore

FILES, FILE_BYTES, SNAPSHOTS, CHANGED = 100, 10 * 1024 + 246, 10, 5
ACCOUNT, COMPUTER = "bench", "1:"


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
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.1).close()
                break
            except OSError:
                await task.deferLater(reactor, 0.05)
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.snapshots", description=__doc__)
    parser.add_argument("--redis", action="store_true", help="also the Redis store")
    args = parser.parse_args(argv)

    async def run(reactor) -> None:
        results = [await sqlite(reactor)]
        if args.redis:
            results.append(await redis(reactor))
        for figures in results:
            print(orjson.dumps(figures, option=orjson.OPT_INDENT_2).decode())

    task.react(lambda reactor: ensureDeferred(run(reactor)))


if __name__ == "__main__":
    main()
