"""The probe against the real opencode server (npm package opencode-ai)."""

import os
import shutil

import treq
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase
from twisted.web.client import HTTPConnectionPool

from tests.processes import REPO, clean_env, spawn
from tests.support import bounded, closed_port, connect, reactor, start_gateway

OPENCODE = os.environ.get("OPENCODE_BIN") or os.path.join(
    REPO, ".opencode", "node_modules", ".bin", "opencode"
)
PASSWORD = "oc-test-password"


async def answering(url: str, seconds: float = 30) -> None:
    """Wait until ``url`` answers HTTP at all (opencode accepts before it answers)."""
    pool = HTTPConnectionPool(reactor(), persistent=False)
    deadline = reactor().seconds() + seconds
    while True:
        try:
            response = await bounded(treq.get(url, pool=pool), 2)
            await bounded(treq.content(response), 2)
            return
        except Exception:
            if reactor().seconds() > deadline:
                raise
            await deferLater(reactor(), 0.1, lambda: None)


class RealOpencodeTests(TestCase):
    timeout = 90

    async def setUp(self):
        if not os.path.exists(OPENCODE):
            self.fail(f"{OPENCODE} is missing: run 'make test', which installs it")
        port = closed_port()
        home = os.path.abspath(self.mktemp())
        os.makedirs(home)
        self.addCleanup(shutil.rmtree, home, ignore_errors=True)
        env = clean_env(
            HOME=home,
            XDG_CONFIG_HOME=os.path.join(home, ".config"),
            XDG_DATA_HOME=os.path.join(home, ".local", "share"),
            XDG_CACHE_HOME=os.path.join(home, ".cache"),
            XDG_STATE_HOME=os.path.join(home, ".local", "state"),
            OPENCODE_DISABLE_MODELS_FETCH="1",
            OPENCODE_SERVER_PASSWORD=PASSWORD,
        )
        argv = [OPENCODE, "serve", "--port", str(port), "--hostname", "127.0.0.1"]
        self.opencode = spawn(self, argv, env, cwd=home)
        self.url = f"http://127.0.0.1:{port}"
        await self.opencode.wait_for(r"listening on", 30)
        await answering(self.url + "/config")

    async def health_via_computer(self, **settings):
        gateway = start_gateway(self, opencode_url=self.url, **settings)
        computer = await connect(self, gateway.port)
        self.assertTrue((await computer.hello())["ok"])
        reply = await computer.request("probe_gateway")
        self.assertTrue(reply["ok"], reply)
        return reply["payload"]

    async def test_right_password(self):
        payload = await self.health_via_computer(opencode_password=PASSWORD)
        self.assertEqual(payload, {"sandboxOk": True, "opencodeOk": True})

    async def test_wrong_password(self):
        payload = await self.health_via_computer(opencode_password="wrong")
        self.assertFalse(payload["opencodeOk"])
        self.assertIn("401", payload["opencodeDetail"])
        self.assertNotIn("wrong", payload["opencodeDetail"])

    async def test_wrong_path_reaches_the_web_ui(self):
        """opencode answers unknown paths with its HTML UI and a 200: not healthy."""
        gateway = start_gateway(
            self, opencode_url=self.url + "/not-opencode", opencode_password=PASSWORD
        )
        result = await bounded(gateway.probe.check())
        self.assertFalse(result.ok)
        self.assertIn("not JSON", result.detail)
