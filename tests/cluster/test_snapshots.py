"""The cluster's snapshot store against a real redis-server of the test's own."""

from __future__ import annotations

from twisted.internet import reactor
from twisted.trial.unittest import TestCase

from tests.harness.redis import start_redis
from tests.unit.snapshots.store_tests import A, StoreTests, entry, sha
from trapsandbox.computers import wire
from trapsandbox.computers.wire import GatewayError
from trapsandbox.snapshots.redisstore import RedisStore


class RedisStoreTests(StoreTests, TestCase):
    timeout = 60
    program_examples = 15

    async def open_store(self, **settings):
        if getattr(self, "server", None) is None:
            self.server = await start_redis(self)
        self._settings = settings
        store = RedisStore.connect(self.server.url, reactor, **settings)
        self.addCleanup(store.close)
        return await store.wait_connected(5)

    async def test_content_is_stored_as_bytes_not_text(self):
        store = await self.store()
        data = "é\n".encode() + b"\xff"
        await store.put_content(A, sha(data), data)
        await store.put_content(A, sha("é".encode()), "é".encode())
        self.assertEqual(await store.content(A, sha(data)), data)
        self.assertEqual(await store.content(A, sha("é".encode())), "é".encode())

    async def test_redis_gone_answers_unavailable_at_once(self):
        store = await self.store(call_timeout=1)
        await store.put_content(A, sha(b"x"), b"x")
        await self.server.kill()
        for d in (store.list(A, "1:"), store.commit(A, "1:", {"/x": entry(b"x")}, "ask")):
            try:
                await d
            except GatewayError as error:
                self.assertEqual(error.code, wire.UNAVAILABLE)
            else:
                raise AssertionError("answered without Redis")
