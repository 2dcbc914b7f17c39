"""
Each asking computer's opencode directory (``opencode.directories``): private,
never through a link, plainly named, and given the computer's MCP block.
"""

import os
import stat

import orjson
from twisted.internet.defer import CancelledError, Deferred
from twisted.trial.unittest import SynchronousTestCase

from tests.harness.logcapture import LogCapture
from tests.unit.opencode.helpers import AskTestsMixin, FakeResponse
from trapsandbox import errors, limits
from trapsandbox.errors import GatewayError
from trapsandbox.opencode.directories import directory_name


class AskDirectoryTests(AskTestsMixin, SynchronousTestCase):
    """Each computer's directory is the gateway's own (SPEC §11, issue 19 finding 4)."""

    def directory(self, account="local", trapos="1:a"):
        return os.path.join(self.root, directory_name(account, trapos))

    def refused(self, reason):
        captured = LogCapture(self)
        d = self.ask()
        error = self.failureResultOf(d, GatewayError).value
        self.assertEqual(error.code, errors.OPENCODE_ERROR)
        self.assertIn("ask directory for this computer is not usable", error.message)
        self.assertIn(reason, error.message)
        self.assertEqual(self.outcome("opencode_error"), 1)
        self.assertNotIn("/session", self.http.paths("POST"))  # no session, no prompt
        self.assertNotIn("/mcp", self.http.paths("POST"))
        self.assertTrue(
            [t for t in captured.errors() if self.directory() in t and reason in t],
            captured.texts(),
        )
        self.assertNotIn(("local", "1:a"), self.asks.runs)  # the computer may ask again
        return error

    def test_the_directory_and_opencode_json_are_private(self):
        self.ask()
        path = self.directory()
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o700)
        self.assertEqual(stat.S_IMODE(os.stat(os.path.join(path, "opencode.json")).st_mode), 0o600)

    def test_a_planted_symbolic_link_at_opencode_json_is_refused_and_its_target_untouched(self):
        victim = os.path.abspath(self.mktemp())
        with open(victim, "wb") as f:
            f.write(b"the gateway user's file")
        os.mkdir(self.directory(), 0o700)
        os.symlink(victim, os.path.join(self.directory(), "opencode.json"))
        self.refused("a symbolic link")
        with open(victim, "rb") as f:
            self.assertEqual(f.read(), b"the gateway user's file")

    def test_a_directory_writable_by_others_is_refused(self):
        os.mkdir(self.directory())
        os.chmod(self.directory(), 0o777)
        self.refused("writable by group or others")
        self.assertEqual(os.listdir(self.directory()), [])  # no token left in it

    def test_another_users_directory_is_refused(self):
        if os.geteuid() != 0:
            self.skipTest("only root can give a directory to another user")
        os.mkdir(self.directory(), 0o700)
        os.chown(self.directory(), 65534, 65534)
        self.refused("belongs to another user")

    def test_a_symbolic_link_for_the_directory_is_refused(self):
        elsewhere = os.path.abspath(self.mktemp())
        os.mkdir(elsewhere, 0o700)
        os.symlink(elsewhere, self.directory())
        self.refused("a symbolic link")
        self.assertEqual(os.listdir(elsewhere), [])

    def test_names_are_plain_whatever_the_traposid_and_account(self):
        for account, trapos in (("local", "../../x:.."), ("a/../../b", "7:a/b"), ("x", "7:..")):
            name = directory_name(account, trapos)
            self.assertNotIn("/", name)
            self.assertNotIn("..", name)
        self.assertTrue(directory_name("local", "7:base").startswith("7-"))

    def test_the_mcp_block_outlasts_the_longest_tool_call(self):
        # Issue 26: the operator's block may say 5000 ms; opencode would cut calls at 5.5 s.
        self.http.answers[("GET", "/config")] = {
            "mcp": {"trapsandbox": {"type": "remote", "url": "http://gw/mcp", "timeout": 5000}}
        }
        os.mkdir(self.directory(), 0o700)  # there before: its block also goes through the API
        self.ask()
        (mcp,) = [c for c in self.http.calls if c[:2] == ("POST", "/mcp")]
        timeout = mcp[3]["config"]["timeout"]
        self.assertEqual(timeout, limits.ASK_MCP_TIMEOUT_MS)
        self.assertGreaterEqual(timeout, (limits.MCP_CALL_TIMEOUT + 5) * 1000)
        self.assertEqual(self.block(), mcp[3]["config"])

    def test_a_directory_made_now_gets_its_block_from_opencode_json_only(self):
        # No request has named it, so opencode has no instance of it: the one it makes at
        # POST /session reads the file (a POST /mcp would connect the tools a second time).
        self.ask()
        self.assertEqual(self.http.paths("POST")[0], "/session")
        self.assertNotIn("/mcp", self.http.paths("POST"))
        token = self.block()["headers"]["Authorization"].encode()
        self.assertEqual(self.asks.tokens.scope_of(token), ("local", "1:a"))

    def test_a_directory_there_before_is_given_the_block_through_the_api_too(self):
        # The gateway restarted: opencode may hold a live instance with an older token.
        os.mkdir(self.directory(), 0o700)
        with open(os.path.join(self.directory(), "opencode.json"), "wb") as f:
            f.write(b'{"mcp": {"trapsandbox": {"headers": {"Authorization": "Bearer old"}}}}')
        os.chmod(os.path.join(self.directory(), "opencode.json"), 0o600)
        self.ask()
        (mcp,) = [c for c in self.http.calls if c[:2] == ("POST", "/mcp")]
        self.assertEqual(mcp[2], [self.directory()])
        self.assertEqual(mcp[3]["config"], self.block())
        token = self.block()["headers"]["Authorization"].encode()
        self.assertEqual(self.asks.tokens.scope_of(token), ("local", "1:a"))
        posts = self.http.paths("POST")
        self.assertLess(posts.index("/mcp"), posts.index("/session"))

    def test_asks_arriving_while_the_block_is_read_share_that_read(self):
        held = self.http.answers[("GET", "/config")]
        self.http.answers[("GET", "/config")] = reading = Deferred()
        asks = [self.ask(trapos=f"{n}:x") for n in (1, 2, 3)]
        self.assertEqual(self.http.paths("GET").count("/config"), 1)
        asks[1].cancel()  # one ask going away does not end the others' read
        self.failureResultOf(asks[1], CancelledError)
        reading.callback(FakeResponse(200, orjson.dumps(held)))
        self.assertEqual(self.http.paths("GET").count("/config"), 1)
        self.assertEqual(self.block("1:x")["url"], "http://gw/mcp")
        self.assertEqual(self.block("3:x")["url"], "http://gw/mcp")

    def test_a_failed_read_of_the_block_fails_who_waited_and_is_tried_again(self):
        self.http.answers[("GET", "/config")] = reading = Deferred()
        asks = [self.ask(trapos=f"{n}:x") for n in (1, 2)]
        reading.callback(FakeResponse(500, b""))
        for ask in asks:
            error = self.failureResultOf(ask, GatewayError).value
            self.assertIn("answered HTTP 500 to GET /config", error.message)
        self.http.answers[("GET", "/config")] = {
            "mcp": {"trapsandbox": {"type": "remote", "url": "http://gw3/mcp"}}
        }
        self.ask(trapos="3:x")
        self.assertEqual(self.http.paths("GET").count("/config"), 2)
        self.assertEqual(self.block("3:x")["url"], "http://gw3/mcp")

    def test_the_operators_block_is_read_once_in_a_while(self):
        self.ask(trapos="1:a")
        self.ask(trapos="2:b")
        self.assertEqual(self.http.paths("GET").count("/config"), 1)
        self.http.answers[("GET", "/config")] = {
            "mcp": {"trapsandbox": {"type": "remote", "url": "http://gw2/mcp"}}
        }
        self.clock.advance(limits.ASK_CONFIG_TTL)
        self.ask(trapos="3:c")
        self.assertEqual(self.http.paths("GET").count("/config"), 2)
        self.assertEqual(self.block("3:c")["url"], "http://gw2/mcp")
        self.assertEqual(self.block("2:b")["url"], "http://gw/mcp")
