"""
The computer's settings file (it holds its sandbox password) is out of reach of
file requests (SPEC §9): the gateway's rule (``trapsandbox.computers.settingsfile``), its
Lua twin (``isSettingsPath`` in libsandbox, run here on Lua 5.2) agreeing with
it, and the refusal before anything is sent, through the registry and the HTTP
endpoints.
"""

import orjson
from hypothesis import given
from hypothesis import strategies as st
from treq.testing import StubTreq
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from tests.harness import lua52
from tests.harness.apps import gateway_app
from tests.harness.callers import asking
from tests.harness.fakes import FakeLink, SandboxComputer
from trapsandbox import errors
from trapsandbox.computers import paths, settingsfile
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.session import Session
from trapsandbox.errors import GatewayError

# (path, cwd): the settings file however CraftOS would spell it.
SETTINGS_SPELLINGS = [
    ("/.settings", None),
    (".settings", None),
    ("//.settings", None),
    ("/./.settings", None),
    ("./.settings", None),
    ("/.settings/", None),
    ("\\.settings", None),
    ("/rom/../.settings", None),
    ("../.settings", None),
    ("/ .settings ", None),
    ("/.SETTINGS", None),
    ("/.Settings", None),
    ("/.settings.", None),
    ("/.settings. . ", None),
    ("/.set*tings", None),
    ('/.set"ting:s?', None),
    ("/*/../.settings", None),
    ("/x/ .. /.settings", None),
    ("/.settings/part", None),
    ("/.settings\x01", None),
    ("/.settings\u00e9", None),
    ("/" + ".settings" + " " * 250 + "x", None),
    (".settings", "/"),
    (".settings", "foo/.."),
    ("../.settings", "foo"),
    ("x/../../.settings", "rom"),
]
OTHER_PATHS = [
    ("/", None),
    ("", None),
    ("/settings", None),
    ("/.settings.bak", None),
    ("/.settingsx", None),
    ("/disk/.settings", None),
    ("/foo/.settings", None),
    (".settings", "foo"),
    ("/.sandbox-settings", None),
    ("/startup/sandbox-daemon.lua", None),
    ("/..settings.sandbox-part", None),
    ("x/../.settings", "rom"),
]


def lua_rule():
    """libsandbox's isSettingsPath on a fresh Lua 5.2 runtime, taking Python strings."""
    lua = lua52.runtime()
    lib = lua52.libsandbox(lua)()

    def check(path, cwd=None):
        encoded = None if cwd is None else cwd.encode("utf-8", "surrogatepass")
        return lib.isSettingsPath(path.encode("utf-8", "surrogatepass"), encoded)

    return check


class RuleTests(SynchronousTestCase):
    def test_every_spelling_of_the_settings_file_and_no_other_path(self):
        lua = lua_rule()
        for path, cwd in SETTINGS_SPELLINGS:
            self.assertIs(settingsfile.is_settings_path(path, cwd), True, (path, cwd))
            self.assertIs(lua(path, cwd), True, (path, cwd))
        for path, cwd in OTHER_PATHS:
            self.assertIs(settingsfile.is_settings_path(path, cwd), False, (path, cwd))
            self.assertIs(lua(path, cwd), False, (path, cwd))

    @given(
        st.lists(
            st.sampled_from(
                [
                    "/",
                    "\\",
                    ".",
                    "..",
                    " ",
                    ".settings",
                    ".SETTINGS",
                    "settings",
                    "s",
                    "x",
                    "*",
                    "?",
                    ":",
                    '"',
                    "|",
                    "\t",
                    "\x7f",
                    "\u00e9",
                    "\x00",
                    "rom",
                ]
            ),
            max_size=12,
        ).map("".join),
        st.one_of(st.none(), st.sampled_from(["", "/", "foo", "foo/..", "a/b", ".settings"])),
    )
    def test_the_gateway_and_the_computer_agree(self, path, cwd):
        self.assertEqual(settingsfile.is_settings_path(path, cwd), self.lua(path, cwd))

    def setUp(self):
        self.lua = lua_rule()


class RefusalTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.registry = Registry(self.clock, request_timeout=60)
        self.link = FakeLink()
        self.registry.add(
            Session("local", "7:base", self.link, self.clock, capabilities={"fs.read", "fs.write"})
        )

    def test_file_requests_on_the_settings_file_are_never_sent(self):
        def payloads(kind, path, **more):
            if kind == "write_files":  # any of its files may be it
                files = [{"path": "/x", "size": 0}, {"path": path, "size": 0}]
                return [{"files": files, **more}]
            if kind != "move_file":
                return [{"path": path, **more}]
            # A move names two paths: either may be it.
            return [{"from": path, "to": "/x", **more}, {"from": "/x", "to": path, **more}]

        for kind in sorted(paths.FILE_REQUESTS):
            for payload in [
                *payloads(kind, "/.settings"),
                *payloads(kind, ".SETTINGS", cwd="rom/.."),
            ]:
                d = self.registry.request(asking("7:base"), kind, payload)
                error = self.failureResultOf(d, GatewayError).value
                self.assertEqual(error.code, errors.FORBIDDEN)
                self.assertIn("settings file", error.message)
                self.assertIn("sandbox password", error.message)
        self.assertEqual(self.link.sent, [])

    def test_other_files_and_other_requests_go_out(self):
        self.registry.request(asking("7:base"), "read_file", {"path": "/startup.lua"})
        self.registry.request(asking("7:base"), "list_files", {"path": "/"})
        self.registry.request(asking("7:base"), "ping", {"path": "/.settings"})
        # A path that is no path is the registry's to refuse (the one path rule), sent nowhere.
        refused = self.registry.request(asking("7:base"), "read_file", {"path": 7})
        self.assertEqual(self.failureResultOf(refused, GatewayError).value.code, "bad_request")
        self.assertEqual(
            [frame["type"] for frame in self.link.sent], ["read_file", "list_files", "ping"]
        )


class EndpointTests(SynchronousTestCase):
    def setUp(self):
        registry = Registry(Clock(), request_timeout=60)
        self.computer = SandboxComputer.connect(registry)
        self.computer.files[".settings"] = b'{ ["sandbox.password"] = "hunter2" }'
        app = gateway_app(registry)
        self.http = StubTreq(app.resource())

    def test_every_file_endpoint_answers_403_forbidden(self):
        for action, body in [
            ("read-file", {"path": "/.settings"}),
            ("list-files", {"path": "//.settings/"}),
            ("write-file", {"path": "/.Settings", "content": ""}),
            ("delete-file", {"path": "rom/../.settings"}),
        ]:
            d = self.http.post(
                f"http://127.0.0.1:4444/computers/7%3Abase/{action}",
                data=orjson.dumps(body),
                headers={"content-type": "application/json"},
            )
            self.http.flush()
            response = self.successResultOf(d)
            answer = orjson.loads(self.successResultOf(self.http.content(response)))
            self.assertEqual(
                (response.code, answer["ok"], answer["code"]), (403, False, "forbidden")
            )
            self.assertNotIn("hunter2", str(answer))
        self.assertEqual(self.computer.sent, [])
        self.assertIn(b"hunter2", self.computer.files[".settings"])
