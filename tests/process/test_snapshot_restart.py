"""
Snapshots outlive the gateway (SPEC §15): a real twistd keeps them in SQLite in its
SANDBOX_STATE_DIR; killed (-9) and started again on the same directory, it still lists the
snapshot, and restoring it brings a computer on the Lua harness back to it.
"""

import os
from urllib.parse import quote

import orjson
import treq
from twisted.trial.unittest import TestCase
from twisted.web.client import HTTPConnectionPool

from tests.harness.craftos import Computer
from tests.harness.processes import spawn_gateway
from tests.harness.support import JSON, bounded, closed_port, reactor

CONNECTED = "traposSandboxState and traposSandboxState.connected"


class SnapshotRestartTests(TestCase):
    timeout = 90

    def gateway(self, port, state):
        return spawn_gateway(
            self, port=port, SANDBOX_PASSWORD="sesame", OPENCODE_URL="", SANDBOX_STATE_DIR=state
        )

    async def http(self, method, path, body=None):
        # Loopback without SANDBOX_ADMIN_TOKEN: the operator endpoints answer.
        response = await bounded(
            treq.request(
                method,
                f"http://127.0.0.1:{self.port}{path}",
                headers=JSON,
                data=body,
                pool=self.pool,
            ),
            60,
        )
        return response.code, orjson.loads(await bounded(treq.content(response), 60))

    async def test_a_snapshot_is_listed_and_restored_after_a_restart(self):
        self.port = closed_port()
        self.pool = HTTPConnectionPool(reactor(), persistent=False)
        state = os.path.abspath(self.mktemp())
        first = self.gateway(self.port, state)
        await first.wait_for(r"listening on", 30)
        c = Computer(self.mktemp(), id=7, label="rs")
        self.addCleanup(c.shutdown)
        c.write_file("/notes.txt", "before\n")
        c.start_client(
            {
                "sandbox.url": f"ws://127.0.0.1:{self.port}/gateway",
                "sandbox.password": "sesame",
                "sandbox.allow": "fs.read,fs.write",
            }
        )
        await c.wait_for_lua(CONNECTED)
        base = f"/computers/{quote('7:rs', safe='')}/snapshots"
        status, taken = await self.http("POST", base, b"{}")
        self.assertEqual(status, 200, taken)

        first.signal("KILL")
        await first.wait_ended()
        await c.wait_for_lua("not traposSandboxState.connected")
        c.write_file("/notes.txt", "after\n")
        c.write_file("/new.txt", "made while the gateway was down")
        second = self.gateway(self.port, state)
        await second.wait_for(r"listening on", 30)
        await c.wait_for_lua(CONNECTED, timeout=40)  # its backoff, and a twistd start on a busy box

        status, body = await self.http("GET", base)
        self.assertEqual(status, 200, body)
        self.assertEqual([s["id"] for s in body["snapshots"]], [taken["id"]])
        status, body = await self.http("POST", f"{base}/{taken['id']}/restore", b"{}")
        self.assertEqual(status, 200, body)
        self.assertEqual((body["written"], body["deleted"]), (["/notes.txt"], ["/new.txt"]))
        self.assertEqual(c.read_file("/notes.txt"), b"before\n")
        self.assertIsNone(c.read_file("/new.txt"))
