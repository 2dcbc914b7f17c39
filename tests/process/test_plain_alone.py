"""
The plain gateway needs nothing of the speed layer: ``twistd -n trapsandbox --plain`` in a
process where importing ``trapsandbox.fast`` (or any module of it) fails.
"""

import sys

import orjson
import treq
from twisted.trial.unittest import TestCase
from twisted.web.client import HTTPConnectionPool

from tests.harness.processes import clean_env, spawn
from tests.harness.support import bounded, connect, reactor

# twistd, with every import of trapsandbox.fast refused as if the package were deleted.
WITHOUT_FAST = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name == 'trapsandbox.fast' or name.startswith('trapsandbox.fast.'):
            raise ModuleNotFoundError('no module named ' + name, name=name)
sys.meta_path.insert(0, Refuse())
from twisted.scripts.twistd import run
sys.argv = ['twistd', '-n', '--pidfile=', 'trapsandbox', *sys.argv[1:]]
run()
"""


class PlainAloneTests(TestCase):
    async def test_the_plain_gateway_runs_with_the_speed_layer_gone(self):
        argv = [
            sys.executable,
            "-c",
            WITHOUT_FAST,
            "--plain",
            "--port",
            "tcp:0:interface=127.0.0.1",
        ]
        child = spawn(self, argv, clean_env(SANDBOX_PASSWORD="sesame-sesame", OPENCODE_URL=""))
        port = await child.listening_port()
        await child.wait_for(r"mode: plain \(Twisted, Klein and Autobahn as they ship\)")
        pool = HTTPConnectionPool(reactor(), persistent=False)
        response = await bounded(treq.get(f"http://127.0.0.1:{port}/health", pool=pool))
        self.assertEqual(orjson.loads(await bounded(treq.content(response)))["sandboxOk"], True)
        computer = await connect(self, port)
        reply = await computer.hello("sesame-sesame", "12:plain")
        self.assertTrue(reply["ok"], reply)
        answer = await computer.request("probe_gateway")
        self.assertTrue(answer["ok"], answer)
        child.signal("TERM")
        self.assertEqual(await child.wait_ended(15), 0, child.output)
        self.assertNotIn("Traceback", child.output)
        # The same process in fast mode does need it, and says so plainly.
        argv = [sys.executable, "-c", WITHOUT_FAST, "--port", "tcp:0:interface=127.0.0.1"]
        fast = spawn(self, argv, clean_env(OPENCODE_URL=""))
        self.assertEqual(await fast.wait_ended(15), 1)
        self.assertEqual(
            fast.output.strip().splitlines()[-1],
            "trapsandbox: the fast paths are not installed (no module named trapsandbox.fast): "
            "run with --plain (SANDBOX_FAST_PATHS=0)",
        )
        self.assertNotIn("Traceback", fast.output)
