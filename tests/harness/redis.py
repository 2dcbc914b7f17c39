"""A real ``redis-server`` of a test's own on 127.0.0.1 (Debian's package), always stopped."""

from __future__ import annotations

import shutil

from twisted.internet.defer import Deferred

from tests.harness.processes import Child, clean_env, spawn
from tests.harness.support import closed_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


class RedisServer:
    """One redis-server; ``kill`` and ``start`` again keep its port (it restarts empty)."""

    def __init__(self, testcase) -> None:
        self._testcase = testcase
        self.port = closed_port()
        self.child: Child | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> RedisServer:
        argv = [
            REDIS_SERVER,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
        ]
        self.child = spawn(self._testcase, argv, clean_env())
        await self.child.wait_for(r"Ready to accept connections", 10)
        return self

    async def kill(self) -> None:
        """kill -9: everything it held is lost."""
        self.child.signal("KILL")
        await self.child.wait_ended(5)


async def start_redis(testcase) -> RedisServer:
    """A fresh, empty redis-server on a free loopback port, stopped at the test's cleanup."""
    if not shutil.which("redis-server"):
        raise AssertionError("redis-server is missing: make test installs Debian's redis-server")
    return await RedisServer(testcase).start()


def redis_client(testcase, server: RedisServer) -> Deferred:
    """A txredisapi connection to ``server`` (fires when connected), closed at cleanup."""
    import txredisapi

    d = txredisapi.Connection("127.0.0.1", server.port, reconnect=False, convertNumbers=False)

    def connected(connection):
        testcase.addCleanup(connection.disconnect)
        return connection

    return d.addCallback(connected)
