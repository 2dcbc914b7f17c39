"""The data pack the gateway serves (``GET /client/datapack.zip``, ``web.client.datapack``)."""

import configparser
import io
import json
import zipfile
from pathlib import Path

import orjson
from treq.testing import StubTreq
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from tests.harness.apps import gateway_app
from tests.harness.fakes import FixedProbe
from trapsandbox.computers.registry import Registry
from trapsandbox.opencode.probe import ProbeResult
from trapsandbox.web import client

ROM = "data/computercraft/lua/rom/"
GATEWAY = ROM + "modules/main/sandbox/gateway.lua"


def entries(pack: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(pack)) as z:
        return {name: z.read(name) for name in z.namelist()}


class DatapackTests(SynchronousTestCase):
    def test_every_client_file_is_in_the_rom_as_in_the_tree(self):
        files = entries(client.datapack())
        for source, target in client.DATAPACK.items():
            self.assertEqual(files[ROM + target], client.served(source))
        self.assertEqual(set(files), {"pack.mcmeta", *(ROM + t for t in client.DATAPACK.values())})
        meta = json.loads(files["pack.mcmeta"])
        self.assertEqual(meta["pack"]["pack_format"], client.PACK_FORMAT)
        self.assertEqual([n for n in files if n != n.lower()], [])

    def test_libsandbox_is_its_modules_and_a_loader_not_the_one_file_build(self):
        files = entries(client.datapack())
        modules = ROM + "modules/main/sandbox/"
        carried = sorted(name.removeprefix(modules) for name in files if name.startswith(modules))
        self.assertEqual(carried, sorted(f"{name}.lua" for name in client.MODULES))
        self.assertEqual([n for n in client.MODULES if n != n.lower()], [], "lower case")
        for name in client.MODULES:
            source = (client.lua_dir() / "sandbox" / f"{name}.lua").read_bytes()
            self.assertEqual(files[f"{modules}{name}.lua"], source, name)
        loader = files[ROM + "modules/main/libsandbox.lua"]
        self.assertNotEqual(loader, client.read(client.LIBRARY))
        self.assertLess(len(loader), 4096, "a loader, not the library")
        listed = loader.split(b"local MODULES = {", 1)[1].split(b"}", 1)[0]
        self.assertEqual(
            [name.strip(b" '\n").decode() for name in listed.split(b",")], list(client.MODULES)
        )

    def test_no_module_is_called_gateway(self):
        """rom/modules/main/sandbox/gateway.lua is the URL (`require("sandbox.gateway")`)."""
        self.assertNotIn("gateway", client.MODULES)
        self.assertNotIn(GATEWAY, entries(client.datapack()))
        with zipfile.ZipFile(io.BytesIO(client.datapack("http://gw.example:4444"))) as pack:
            names = pack.namelist()
        self.assertEqual(len(names), len(set(names)), "one entry per name")

    def test_the_gateway_url_is_a_module_of_its_own(self):
        files = entries(client.datapack("https://mc.example:4444"))
        self.assertEqual(
            files[GATEWAY].splitlines()[-1], b"return { url = 'https://mc.example:4444' }"
        )
        self.assertNotIn(GATEWAY, entries(client.datapack()))

    def test_the_same_files_give_the_same_bytes(self):
        self.assertEqual(client.datapack("http://a:1"), client.datapack("http://a:1"))
        self.assertNotEqual(client.datapack("http://a:1"), client.datapack("http://a:2"))

    def test_only_a_plain_url_goes_into_lua(self):
        for url in ("ws://h:1/gateway", "http://[::1]:4444", "https://h.example"):
            self.assertTrue(client.valid_url(url), url)
        for url in ("h:1", "http://h/'..os.shutdown()..'", "ftp://h", "http://h\n", "http://h?x"):
            self.assertFalse(client.valid_url(url), url)
            self.assertRaises(ValueError, client.datapack, url)


class ServedTests(SynchronousTestCase):
    def setUp(self):
        app = gateway_app(Registry(Clock()), FixedProbe(ProbeResult(False, "down")))
        self.http = StubTreq(app.resource())

    def get(self, path, headers=None):
        response = self.successResultOf(
            self.http.get("http://gw.example:4444" + path, headers=headers)
        )
        return response, self.successResultOf(self.http.content(response))

    def test_served_it_names_the_gateway_as_reached(self):
        response, body = self.get("/client/datapack.zip")
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["application/zip"])
        self.assertEqual(body, client.datapack("http://gw.example:4444"))

    def test_url_names_another_or_none(self):
        _, body = self.get("/client/datapack.zip?url=wss://mc.example/gateway")
        self.assertEqual(body, client.datapack("wss://mc.example/gateway"))
        _, body = self.get("/client/datapack.zip?url=none")
        self.assertEqual(body, client.datapack())

    def test_a_strange_url_or_host_is_refused(self):
        response, body = self.get("/client/datapack.zip?url=http://h/'")
        self.assertEqual((response.code, orjson.loads(body)["error"]["code"]), (400, "bad_request"))
        response, body = self.get("/client/datapack.zip", headers={"host": "gw_x"})
        self.assertEqual(response.code, 400)


class InstalledTests(SynchronousTestCase):
    def test_every_file_served_is_installed_with_the_wheel(self):
        """An installed gateway serves lua/ from share/trapsandbox/lua: setup.cfg lists each."""
        config = configparser.ConfigParser()
        config.read(Path(client.__file__).resolve().parents[2] / "setup.cfg")
        installed = set()
        for target, sources in config["options.data_files"].items():
            for source in sources.replace(",", " ").split():
                self.assertEqual("share/trapsandbox/" + str(Path(source).parent), target, source)
                installed.update(
                    str(path.relative_to(client.lua_dir()))
                    for path in client.lua_dir().glob(source.removeprefix("lua/"))
                )
        served = {client.INSTALLER, *client.FILES, *client.DATAPACK}
        modules = {f"sandbox/{name}.lua" for name in client.MODULES}
        self.assertEqual(served - installed, set())
        self.assertEqual(modules - installed, set(), "libsandbox is built from its modules")
