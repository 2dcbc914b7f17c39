"""
Restart: 50 computers running the real Lua daemon are attached to a real
twistd gateway; kill -9 it and start it again: once it listens, every one is
back within the client's second backoff step (2 s + 20 % jitter) plus 2 s (50
computers' hellos in one test process beside three others: 3.44 s was seen),
however long the new twistd took to start (measured on a quiet machine: all
back 1.02 s after the kill, within the first step); the client's longest wait
is 30 s.
"""

import re

from twisted.internet.defer import gatherResults
from twisted.trial.unittest import TestCase

from tests.harness.craftos import Computer
from tests.harness.processes import spawn_gateway
from tests.harness.support import both_modes, closed_port, reactor

COMPUTERS = 50
# The client waits 1 s, then 2 s (each + 20 % jitter) between attempts.
SECOND_BACKOFF_MAX = 2.4


class RestartTests(TestCase):
    timeout = 90

    def gateway(self, port):
        return spawn_gateway(self, port=port, SANDBOX_PASSWORD="sesame", OPENCODE_URL="")

    async def test_all_computers_return_after_kill_9(self):
        port = closed_port()
        first = self.gateway(port)
        await first.wait_for(r"listening on")
        computers = []
        for n in range(COMPUTERS):
            c = Computer(self.mktemp(), id=n, label=f"c{n}")
            self.addCleanup(c.shutdown)
            c.start_client(
                {"sandbox.url": f"ws://127.0.0.1:{port}/gateway", "sandbox.password": "sesame"}
            )
            computers.append(c)
        await gatherResults(
            [
                c.wait_for_lua("traposSandboxState and traposSandboxState.connected")
                for c in computers
            ]
        )

        first.signal("KILL")
        killed_at = reactor().seconds()
        await first.wait_ended()
        await gatherResults([c.wait_for_lua("not traposSandboxState.connected") for c in computers])
        second = self.gateway(port)
        await second.wait_for(r"listening on")
        listening_at = reactor().seconds()
        await gatherResults(
            [c.wait_for_lua("traposSandboxState.connected", timeout=10) for c in computers]
        )
        elapsed = reactor().seconds() - listening_at
        self.assertLess(
            elapsed,
            SECOND_BACKOFF_MAX + 2,
            f"{elapsed:.2f} s after the gateway listened ({reactor().seconds() - killed_at:.2f} s "
            "after the kill)",
        )
        # One line per computer, or (past 20 a second) one line counting the rest, at
        # the end of that second or when the gateway stops.
        second.signal("TERM")
        await second.wait_ended()
        counted = sum(int(n) for n in re.findall(r"(\d+) more computers connected", second.output))
        self.assertEqual(second.output.count(" connected from ") + counted, COMPUTERS)


both_modes(globals(), "RestartTests")
