"""Who is asking (``computers.callers``): one value, aimed at one computer, sent as data."""

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from trapsandbox import errors
from trapsandbox.computers.callers import BY, GATEWAY_SENDER, Caller, Sender
from trapsandbox.errors import GatewayError

names = st.text(min_size=1, max_size=12)


class CallerTests(SynchronousTestCase):
    def test_an_account_is_aimed_at_its_own_computers_only(self):
        alice = Caller("alice", None, Sender("operator", "alice"))
        self.assertEqual(alice.at("alice", "7:").key, ("alice", "7:"))
        with self.assertRaises(GatewayError) as raised:
            alice.at("bob", "7:")
        # Answered as a computer that is not there, whoever's it is (SPEC §12).
        self.assertEqual(raised.exception.code, errors.NOT_CONNECTED)
        self.assertEqual(raised.exception.message, "7: is not connected")

    def test_an_asks_token_is_aimed_at_its_computer_only(self):
        ask = Caller("alice", "7:", Sender("ask"))
        self.assertEqual(ask.at("alice", "7:"), ask)
        for account, trapos_id in (("alice", "8:"), ("bob", "7:")):
            with self.assertRaises(GatewayError):
                ask.at(account, trapos_id)

    def test_the_admin_reaches_every_account(self):
        admin = Caller(None, None, Sender("operator"))
        self.assertEqual(admin.at("bob", "9:").key, ("bob", "9:"))

    def test_a_request_needs_a_computer(self):
        with self.assertRaises(ValueError):
            _ = Caller("alice", None, GATEWAY_SENDER).key

    @given(names, names, st.sampled_from(sorted(BY)), st.none() | names, st.booleans())
    def test_the_relay_carries_it_whole(self, account, trapos_id, by, named, quiet):
        caller = Caller(account, trapos_id, Sender(by, named), quiet)
        self.assertEqual(Caller.from_message(caller.message()), caller)

    def test_a_relayed_sender_that_cannot_be_read_is_the_gateways(self):
        for by in (None, "root", {"by": "nobody"}, ["operator"], {"account": "x"}):
            caller = Caller.from_message({"key": ["a", "1:"], "by": by})
            self.assertEqual(caller.sender, GATEWAY_SENDER)
        caller = Caller.from_message({"key": ["a", "1:"], "by": {"by": "agent", "account": 5}})
        self.assertEqual(caller.sender, Sender("agent"))
