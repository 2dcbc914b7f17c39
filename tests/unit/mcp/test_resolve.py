"""
Which computer a tool call means (SPEC §10, ``mcp.resolve``): omitted, by
traposId, bare id or label; ambiguous and unknown names; whose, among accounts.
"""

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from tests.harness.logcapture import LogCapture
from tests.unit.mcp.helpers import McpTestCase
from trapsandbox.computers.registry import Registry
from trapsandbox.errors import GatewayError
from trapsandbox.mcp import resolve
from trapsandbox.mcp.results import AMBIGUOUS


class ResolutionTests(McpTestCase):
    def test_omitted_with_one_computer(self):
        c = self.computer()
        c.files["a"] = b"x"
        self.assertIn("a  1 bytes", self.text(self.call("list_files", path="/")))

    def test_omitted_with_none_or_several(self):
        result = self.call("read_screen")
        self.assertTrue(result["isError"])
        self.assertIn("No computer is connected", self.text(result))
        self.computer("7:base")
        self.computer("8:")
        result = self.call("read_screen")
        self.assertTrue(result["isError"])
        self.assertIn("7:base, 8:", self.text(result))
        self.assertEqual(result["structuredContent"], {"ok": False, "code": "ambiguous"})

    def test_by_trapos_id_bare_id_and_label(self):
        self.computer("7:base")
        self.computer("8:")
        self.computer("12:mine")
        for name, expected in (
            ("7:base", "7:base"),
            ("8:", "8:"),
            ("8", "8:"),
            ("mine", "12:mine"),
            ("12", "12:mine"),
        ):
            self.assertIn(expected, self.text(self.call("read_screen", computer=name)), name)

    def test_ambiguity_lists_the_candidates(self):
        self.computer("7:base")
        self.computer("9:base")
        self.computer("9:other")
        for name, candidates in (("base", "7:base, 9:base"), ("9", "9:base, 9:other")):
            result = self.call("read_screen", computer=name)
            self.assertTrue(result["isError"])
            self.assertIn(candidates, self.text(result))
            self.assertIn("traposId", self.text(result))

    def test_unknown_computer_lists_the_connected(self):
        self.computer("7:base")
        result = self.call("read_screen", computer="nope")
        self.assertTrue(result["isError"])
        self.assertIn('No connected computer is "nope"', self.text(result))
        self.assertIn("Connected: 7:base", self.text(result))
        result = self.call("read_screen", computer=7)
        self.assertTrue(result["isError"])

    def test_outside_values_are_cut_in_answers_and_logs(self):
        # SPEC §4: a huge ``computer`` (or tool, or method name) is neither echoed nor
        # logged whole.
        self.computer("7:base")
        logs = LogCapture(self)
        huge = "x" * 1_900_000
        result = self.call("read_screen", computer=huge)
        self.assertTrue(result["isError"])
        self.assertLess(len(self.text(result)), 600)
        self.assertIn('"' + "x" * 199 + "\u2026", self.text(result))
        for answer in (
            self.rpc_error("tools/call", {"name": huge}),
            self.rpc_error(huge),
        ):
            self.assertLess(len(answer["message"]), 600)
        self.assertTrue(logs.events)
        self.assertLess(max(len(text) for text in logs.texts()), 2000)


class AccountTests(SynchronousTestCase):
    """
    Which account's computer a name means is the HTTP routes' rule
    (``auth.Operator.account_of``), decided among the computers the caller
    sees: here and, in cluster mode, on the other processes.
    """

    def setUp(self):
        self.registry = Registry(Clock())

    def resolve(self, computer, scope, *held):
        sessions = [
            resolve.Remote(trapos_id, account, frozenset(), None) for account, trapos_id in held
        ]
        return resolve.resolve(self.registry, computer, scope, sessions)

    def test_the_admin_is_told_to_name_the_account_of_a_traposid_held_in_several(self):
        for name in ("7:base", "7", "base"):
            with self.assertRaises(GatewayError) as raised:
                self.resolve(name, None, ("alice", "7:base"), ("bob", "7:base"))
            self.assertEqual(raised.exception.code, AMBIGUOUS)
            self.assertIn("7:base (account alice), 7:base (account bob)", raised.exception.message)
            self.assertIn("Add ?account=NAME to the MCP URL", raised.exception.message)

    def test_a_traposid_held_in_one_account_is_that_accounts_even_on_another_process(self):
        # bob's 7:base is held by another gateway process: not in this registry.
        found = self.resolve("7", None, ("alice", "8:"), ("bob", "7:base"))
        self.assertEqual((found.account_id, found.trapos_id), ("bob", "7:base"))

    def test_a_scoped_caller_gets_its_accounts(self):
        found = self.resolve("base", "bob", ("bob", "7:base"))
        self.assertEqual((found.account_id, found.trapos_id), ("bob", "7:base"))
