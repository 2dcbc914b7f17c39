"""
Resources (SPEC §17, ``mcp.resources``): each visible computer's screen, its
files through the template; text or a base64 blob; the tools' account,
ask-token and capability rules.
"""

import base64

from twisted.internet.defer import Deferred

from tests.harness.callers import mcp_caller
from tests.unit.mcp.helpers import McpTestCase
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.mcp.resources import Resources, parse


class ResourceTests(McpTestCase):
    def test_the_screens_of_the_computers_that_allow_it_are_listed(self):
        self.computer("5:base")
        self.computer("6:", capabilities=("exec",))
        [screen] = self.result("resources/list")["resources"]
        self.assertEqual(screen["uri"], "trapsandbox://5%3Abase/screen")
        self.assertEqual(screen["mimeType"], "text/plain")
        [template] = self.result("resources/templates/list")["resourceTemplates"]
        self.assertEqual(template["uriTemplate"], "trapsandbox://{traposId}/files/{+path}")

    def test_a_screen_reads_as_text(self):
        self.computer("5:base")
        for uri in ("trapsandbox://5%3Abase/screen", "trapsandbox://5:base/screen"):
            [content] = self.result("resources/read", {"uri": uri})["contents"]
            self.assertEqual(content, {"uri": uri, "mimeType": "text/plain", "text": "> hi"})

    def test_files_read_as_text_or_a_blob(self):
        c = self.computer("5:base")
        c.files["/notes/a b.txt"] = "héllo".encode()
        c.files["/bin"] = b"\xff\x00"
        uri = "trapsandbox://5%3Abase/files/notes/a%20b.txt"
        [content] = self.result("resources/read", {"uri": uri})["contents"]
        self.assertEqual(content["text"], "héllo")
        [content] = self.result("resources/read", {"uri": "trapsandbox://base/files/bin"})[
            "contents"
        ]
        self.assertEqual(base64.b64decode(content["blob"]), b"\xff\x00")
        self.assertNotIn("text", content)

    def test_what_cannot_be_read_is_an_error_that_says_why(self):
        self.computer("5:base", capabilities=("exec",))
        for uri, code, says in (
            ("trapsandbox://5%3Abase/screen", -32003, 'run "sandbox allow screen"'),
            ("trapsandbox://5%3Abase/files/a", -32003, 'run "sandbox allow fs.read"'),
            ("trapsandbox://9/screen", -32002, 'No connected computer is "9"'),
            ("trapsandbox://5/elsewhere", -32602, "trapsandbox://{traposId}/screen"),
            ("http://5/screen", -32602, "must be a trapsandbox:// URI"),
            (None, -32602, "must be a trapsandbox:// URI"),
        ):
            error = self.rpc_error("resources/read", {"uri": uri})
            self.assertEqual(error["code"], code, uri)
            self.assertIn(says, error["message"], uri)

    def test_parse(self):
        self.assertEqual(parse("trapsandbox://7%3Ab/files/a/b.lua"), ("7:b", "files", "/a/b.lua"))
        self.assertEqual(parse("trapsandbox://7/files//x"), ("7", "files", "/x"))


class AccountTests(McpTestCase):
    """The tools' rules: an account's computers, the admin's all, an ask's token its own."""

    def setUp(self):
        super().setUp()
        self.computer("5:base", account_id="alice").files["/a"] = b"alice's"
        self.computer("6:", account_id="bob").files["/a"] = b"bob's"
        self.resources = Resources(self.registry, Sandbox(self.registry))

    def read(self, uri, scope, pin=None):
        return Deferred.fromCoroutine(self.resources.read({"uri": uri}, mcp_caller(scope, pin)))

    def listed(self, scope, pin=None):
        d = Deferred.fromCoroutine(self.resources.list(mcp_caller(scope, pin)))
        return [r["uri"] for r in self.successResultOf(d)["resources"]]

    def test_each_caller_sees_its_computers(self):
        self.assertEqual(self.listed("alice"), ["trapsandbox://5%3Abase/screen"])
        self.assertEqual(
            self.listed(None), ["trapsandbox://5%3Abase/screen", "trapsandbox://6%3A/screen"]
        )
        self.assertEqual(self.listed(None, ("bob", "6:")), ["trapsandbox://6%3A/screen"])

    def test_another_accounts_computer_is_not_found(self):
        failure = self.failureResultOf(self.read("trapsandbox://6%3A/files/a", "alice"))
        self.assertEqual(failure.value.code, -32002)
        [content] = self.successResultOf(self.read("trapsandbox://6%3A/files/a", "bob"))["contents"]
        self.assertEqual(content["text"], "bob's")

    def test_an_ask_token_reads_its_own_computer_only(self):
        pin = ("alice", "5:base")
        failure = self.failureResultOf(self.read("trapsandbox://6%3A/files/a", None, pin))
        self.assertEqual(failure.value.code, -32002)
        [content] = self.successResultOf(self.read("trapsandbox://5/files/a", None, pin))[
            "contents"
        ]
        self.assertEqual(content["text"], "alice's")
