"""The probe against the real opencode server (npm package opencode-ai)."""

from twisted.trial.unittest import TestCase

from tests.harness.opencode import SharedOpencode
from tests.harness.support import bounded, connect, start_gateway

PASSWORD = "oc-test-password"


class RealOpencodeTests(TestCase):
    """The gateway's probe of the real opencode: one for the class (``SharedOpencode``)."""

    timeout = 90
    shared = SharedOpencode(PASSWORD)

    @classmethod
    def tearDownClass(cls):
        cls.shared.stop()

    async def setUp(self):
        self.shared.serves(self)
        self.url = await self.shared.start(self, {})

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
