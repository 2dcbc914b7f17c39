"""``trapsandbox-ctl datapack``: the gateway's data pack written to a file."""

import os
import zipfile

from tests.process.test_ctl import CtlTestCase
from trapsandbox.web import client

GATEWAY = "data/computercraft/lua/rom/modules/main/sandbox/gateway.lua"


class DatapackCommandTests(CtlTestCase):
    async def test_writes_the_pack_naming_the_gateway(self):
        out = os.path.abspath(self.mktemp())
        code, output = await self.ctl("datapack", "-o", out)
        self.assertEqual(code, 0, output)
        self.assertIn(f"{out}: ", output)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), client.datapack(self.url))

    async def test_another_gateway_or_none(self):
        out = os.path.abspath(self.mktemp())
        code, output = await self.ctl("datapack", "-o", out, "--gateway", "https://mc.example")
        self.assertEqual(code, 0, output)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), client.datapack("https://mc.example"))
        code, output = await self.ctl("datapack", "-o", out, "--no-gateway")
        self.assertEqual(code, 0, output)
        with zipfile.ZipFile(out) as z:
            self.assertNotIn(GATEWAY, z.namelist())
        with open(out, "rb") as f:
            self.assertEqual(f.read(), client.datapack())

    async def test_a_bad_url_is_one_line(self):
        code, output = await self.ctl("datapack", "-o", self.mktemp(), "--gateway", "h:1")
        self.assertEqual(code, 1)
        self.assertIn("bad_request", output)
        self.assertEqual(len(output.strip().splitlines()), 1, output)
