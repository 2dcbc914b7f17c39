"""
Where an idle computer's bytes go: the gateway (or the bare server) in this
process, computers from a child process, and what each one costs.

    python -m bench.memprobe [--computers N] [--target gateway|bare] [--trace]

The server (the real ``GatewayService``, with a password, or the bare echo
server of :mod:`bench.bare`) runs here; a child process (the benchmark's
picows generator, :mod:`bench.load`) opens a few computers to warm it up,
then N more, each through hello, and keeps them open.  The RSS before and
after gives bytes per computer as the benchmark counts them; with
``--trace``, ``tracemalloc`` snapshots around the N give the Python
allocations each computer keeps, by file and by line (tracing slows the
server and grows its RSS: compare RSS figures only between runs without it).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tracemalloc

import orjson

SECRET = "memprobe-secret"
WARM = 200


def _client(spec: dict) -> None:
    """The child: open WARM computers, say so, wait, open the rest, say so, wait."""
    from bench import load, proc

    proc.raise_fd_limit()

    async def run() -> None:
        generator = load.Generator(spec)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        kept = []
        for count in (WARM, spec["computers"]):
            opened, _, errors = await generator.open_many(
                generator.next_ids(count, "mem"), 100, 120
            )
            kept += opened
            await asyncio.sleep(0.5)
            print(orjson.dumps({"opened": len(opened), "errors": dict(errors)}).decode())
            sys.stdout.flush()
            await reader.readline()
        await generator.close_many(kept)

    import uvloop

    uvloop.run(run())


def _server(args: argparse.Namespace) -> None:
    from twisted.internet import endpoints, protocol, reactor

    from bench import proc
    from trapsandbox import config
    from trapsandbox.tap import build

    proc.raise_fd_limit()
    if args.daemon_gc:
        from trapsandbox import limits

        gc.collect()
        gc.freeze()
        gc.set_threshold(limits.GC_THRESHOLD, 10, 10)
    if args.trace:
        tracemalloc.start(args.frames)
    port_text = "tcp:0:interface=127.0.0.1:backlog=1024"
    gateway = build(config.Settings(ports=(port_text,), opencode_url="", password=SECRET), reactor)
    marks: list = []

    if args.garbage:
        gc.disable()

    def mark() -> None:
        if args.garbage:
            rss = proc.rss_bytes(os.getpid())
            found = gc.collect()
            print(f"garbage: {found} objects in cycles; RSS {rss:,} before collecting", flush=True)
        if not args.daemon_gc:
            gc.collect()
        rss = proc.rss_bytes(os.getpid())
        snapshot = tracemalloc.take_snapshot() if args.trace else None
        marks.append((rss, snapshot))

    class Child(protocol.ProcessProtocol):
        buffer = b""

        def outReceived(self, data: bytes) -> None:
            self.buffer += data
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                print("client:", line.decode(), flush=True)
                mark()
                if len(marks) == 2:
                    report(args, marks)
                    if args.inspect:
                        inspect(gateway)
                self.transport.write(b"go\n")

        def errReceived(self, data: bytes) -> None:
            sys.stderr.write(data.decode())

        def processEnded(self, reason) -> None:
            reactor.stop()

    def listening(port) -> None:
        address = port.getHost()
        spec = {
            "target": args.target,
            "url": f"ws://127.0.0.1:{address.port}/gateway?n=1",
            "address": f"127.0.0.1:{address.port}",
            "server_pid": os.getpid(),
            "secret": SECRET if args.target == "gateway" else None,
            "computers": args.computers,
        }
        child = [sys.executable, "-m", "bench.memprobe", "--child", orjson.dumps(spec).decode()]
        reactor.spawnProcess(Child(), sys.executable, child, env=os.environ)

    if args.target == "bare":
        from bench.bare import Echo

        gateway.factory.protocol = Echo
        d = endpoints.serverFromString(reactor, port_text).listen(gateway.factory)
        d.addCallback(listening)
    else:
        gateway.service.privilegedStartService()
        gateway.service.startService()
        reactor.callWhenRunning(lambda: listening(gateway.listeners[0].port))
    reactor.run()


def report(args: argparse.Namespace, marks: list) -> None:
    (rss0, snap0), (rss1, snap1) = marks
    n = args.computers
    print(f"RSS: {(rss1 - rss0) / n:,.0f} bytes per computer ({n} computers)")
    if snap1 is None:
        return
    filters = [tracemalloc.Filter(False, tracemalloc.__file__)]
    snap0, snap1 = snap0.filter_traces(filters), snap1.filter_traces(filters)
    total = sum(s.size_diff for s in snap1.compare_to(snap0, "filename"))
    print(f"tracemalloc: {total / n:,.0f} bytes per computer")
    for key in ("filename", "lineno"):
        print(f"\nby {key}:")
        for stat in snap1.compare_to(snap0, key)[: args.top]:
            if abs(stat.size_diff) < n * 8:
                continue
            frame = stat.traceback[0]
            where = frame.filename.split("site-packages/")[-1].split("wt-mem/")[-1]
            if key == "lineno":
                where += f":{frame.lineno}"
            print(f"  {stat.size_diff / n:8.0f} B {stat.count_diff / n:6.2f} blocks  {where}")
    if args.tracebacks:
        print("\nby traceback:")
        for stat in snap1.compare_to(snap0, "traceback")[: args.tracebacks]:
            print(f"\n  {stat.size_diff / n:.0f} B {stat.count_diff / n:.2f} blocks")
            for line in stat.traceback.format(limit=args.frames)[-2 * args.frames :]:
                print("   ", line.replace("/work/main/.venv/lib/python3.11/site-packages/", ""))


def inspect(gateway) -> None:
    """One connection's objects: each one's own size, attributes, dict kind."""
    import sys as _sys

    kind = gateway.factory.protocol
    connection = next((o for o in gc.get_objects() if type(o) is kind), None)
    if connection is None:
        return
    seen: set[int] = set()
    shared = {id(gateway.service), id(gateway.factory), id(gateway.registry)}

    def walk(obj, name, depth):
        if id(obj) in seen or id(obj) in shared or depth > 3:
            return
        seen.add(id(obj))
        size = _sys.getsizeof(obj)
        d = getattr(obj, "__dict__", None)
        extra = ""
        if isinstance(d, dict):
            extra = f" __dict__ {_sys.getsizeof(d)} B, {len(d)} keys"
        print(f"  {'  ' * depth}{name}: {type(obj).__name__} {size} B{extra}")
        if isinstance(d, dict):
            for key, value in d.items():
                if isinstance(value, (int, float, bool, type(None))):
                    continue
                walk(value, f".{key}", depth + 1)

    print("\none connection:")
    walk(connection, "protocol", 0)
    walk(connection.transport, "transport", 0)
    print("  protocol keys:", " ".join(vars(connection)))
    print("  transport keys:", " ".join(vars(connection.transport)))
    from collections import Counter

    from twisted.internet import tcp

    servers = [o for o in gc.get_objects() if type(o) is tcp.Server]
    names = Counter(k for o in servers for k in vars(o))
    sizes = Counter(_sys.getsizeof(vars(o)) for o in servers)
    print(f"  {len(servers)} tcp.Server, dict sizes {dict(sizes)}, names {dict(names)}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.memprobe", description=__doc__)
    parser.add_argument("--computers", type=int, default=2000)
    parser.add_argument("--target", choices=("gateway", "bare"), default="gateway")
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--frames", type=int, default=12)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--tracebacks", type=int, default=0)
    parser.add_argument("--inspect", action="store_true")
    parser.add_argument(
        "--garbage", action="store_true", help="no cyclic GC: count what each step leaves in cycles"
    )
    parser.add_argument(
        "--daemon-gc",
        action="store_true",
        help="the cyclic GC as twistd trapsandbox sets it (frozen, threshold), no collect",
    )
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        _client(orjson.loads(args.child))
    else:
        _server(args)


if __name__ == "__main__":
    main()
