"""The cluster's snapshot store against a real redis-server of the test's own."""

from __future__ import annotations

import orjson
from twisted.internet import reactor
from twisted.trial.unittest import TestCase

from tests.cluster.helpers import Http, start_gateway
from tests.harness.craftos import Computer
from tests.harness.redis import start_redis
from tests.unit.snapshots.store_tests import A, StoreTests, entry, sha
from trapsandbox import errors
from trapsandbox.errors import GatewayError
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
                self.assertEqual(error.code, errors.UNAVAILABLE)
            else:
                raise AssertionError("answered without Redis")


class SharedSnapshotsTests(TestCase):
    """SPEC §13, §15: every process lists and restores the snapshots any process took."""

    timeout = 120

    async def test_taken_through_one_process_restored_through_the_other(self):
        redis = await start_redis(self)
        a = await start_gateway(self, redis.url)
        b = await start_gateway(self, redis.url)
        http = Http()
        c = Computer(self.mktemp(), id=5, label="shared")
        self.addCleanup(c.shutdown)
        c.write_file("/notes.txt", "before\n")
        c.start_client(
            {"sandbox.url": f"ws://127.0.0.1:{a.port}/gateway", "sandbox.allow": "fs.read,fs.write"}
        )
        await c.wait_for_lua("traposSandboxState and traposSandboxState.connected")

        # Listed at b before it has any: none, not "not connected" (a holds it), while a
        # computer nobody holds is.
        code, listed = await http.get(b, "/computers/5%3Ashared/snapshots")
        self.assertEqual((code, listed), (200, {"ok": True, "snapshots": []}))
        code, missing = await http.get(b, "/computers/6%3Anobody/snapshots")
        self.assertEqual((code, missing["code"]), (404, "not_connected"))

        # Taken at b, which asks a's computer for its files through the cluster.
        code, body = await http.request(b, "5:shared", {}, path="snapshots", seconds=30)
        taken = orjson.loads(body)
        self.assertEqual(code, 200, taken)
        self.assertEqual(taken["files"], 3)  # the notes and the client's two files
        c.write_file("/notes.txt", "after\n")
        c.write_file("/new.txt", "made after the snapshot")

        code, listed = await http.get(a, "/computers/5%3Ashared/snapshots")
        self.assertEqual((code, [s["id"] for s in listed["snapshots"]]), (200, [taken["id"]]))
        code, changes = await http.get(
            a, f"/computers/5%3Ashared/snapshots/{taken['id']}/changes", 30
        )
        self.assertEqual(code, 200, changes)
        self.assertEqual(
            ([f["path"] for f in changes["added"]], [f["path"] for f in changes["modified"]]),
            (["/new.txt"], ["/notes.txt"]),
        )
        code, body = await http.request(
            a, "5:shared", {}, path=f"snapshots/{taken['id']}/restore", seconds=30
        )
        restored = orjson.loads(body)
        self.assertEqual(code, 200, restored)
        self.assertEqual(c.read_file("/notes.txt"), b"before\n")
        self.assertIsNone(c.read_file("/new.txt"))
        # The snapshot the restore took first is listed at b too: the undo of the undo.
        code, listed = await http.get(b, "/computers/5%3Ashared/snapshots")
        self.assertEqual([s["id"] for s in listed["snapshots"]], [restored["before"], taken["id"]])
