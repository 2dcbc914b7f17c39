"""
The one budget of long-lived streams (issue 43, ``trapsandbox.computers.streams``): how many
each account holds, and how many bytes wait for one HTTP stream's reader.
"""

from twisted.trial.unittest import SynchronousTestCase

from trapsandbox import errors
from trapsandbox.computers.callers import Caller, Sender
from trapsandbox.computers.streams import StreamBudget
from trapsandbox.errors import GatewayError


class Request:
    """What a ``Held`` uses of a twisted.web request."""

    def __init__(self):
        self.written = []
        self.producer = None

    def write(self, data):
        self.written.append(data)

    def registerProducer(self, producer, streaming):
        assert self.producer is None and streaming
        self.producer = producer

    def unregisterProducer(self):
        self.producer = None


def operator(account):
    return Caller(account, "1:", Sender("operator", account))


class BudgetTests(SynchronousTestCase):
    def test_each_kind_is_bounded_per_account_and_given_back_once(self):
        budget = StreamBudget(most=2)
        backs = [budget.take(operator("alice"), "subscription") for _ in range(2)]
        with self.assertRaises(GatewayError) as raised:
            budget.take(operator("alice"), "subscription")
        self.assertEqual(raised.exception.code, errors.TOO_MANY_WATCHES)
        self.assertEqual(
            raised.exception.message,
            "account alice already has 2 subscription watches open here; end one first",
        )
        budget.take(operator("alice"), "activity")  # another kind: its own bound
        budget.take(operator("bob"), "subscription")  # another account: its own
        backs[0]()
        backs[0]()  # twice is once
        self.assertEqual(budget.holding("subscription", "alice"), 1)
        budget.take(operator("alice"), "subscription")
        self.assertRaises(GatewayError, budget.take, operator("alice"), "subscription")

    def test_an_asks_token_counts_against_its_computers_account(self):
        budget = StreamBudget(most=1)
        ask = Caller("alice", "1:", Sender("ask"))
        budget.take(ask, "subscription")
        self.assertRaises(GatewayError, budget.take, ask, "subscription")
        self.assertRaises(GatewayError, budget.take, operator("alice"), "subscription")
        # The admin and the gateway are not counted.
        for _ in range(3):
            budget.take(Caller(None, None, Sender("operator")), "subscription")
            budget.take(Caller("alice", "1:", Sender("gateway")), "subscription")


class HeldTests(SynchronousTestCase):
    def setUp(self):
        self.request = Request()
        self.held = StreamBudget(most_held=100).held(self.request)

    def test_writes_pass_while_the_reader_reads(self):
        self.assertIs(self.request.producer, self.held)
        for _ in range(10):
            self.assertTrue(self.held.write(b"x" * 1000))
        self.assertIsNone(self.held.room())
        self.assertEqual(len(self.request.written), 10)

    def test_past_the_bound_of_a_paused_reader_writes_are_refused(self):
        self.held.pauseProducing()
        self.assertTrue(self.held.write(b"x" * 60))
        self.held.pauseProducing()  # a transport says it again on each write past its buffer
        self.assertTrue(self.held.write(b"x" * 40))
        self.assertFalse(self.held.write(b"x"))
        self.assertEqual(b"".join(self.request.written), b"x" * 100)
        # Read again: the bound counts anew.
        self.held.resumeProducing()
        self.held.pauseProducing()
        self.assertTrue(self.held.write(b"y" * 100))

    def test_room_waits_for_the_reader_and_for_nothing_once_it_is_gone(self):
        self.held.pauseProducing()
        room = self.held.room()
        self.assertNoResult(room)
        self.held.resumeProducing()
        self.successResultOf(room)
        self.held.pauseProducing()
        cancelled = self.held.room()
        cancelled.cancel()
        self.failureResultOf(cancelled)
        waiting = self.held.room()
        self.held.stopProducing()  # the reader left
        self.successResultOf(waiting)
        self.assertFalse(self.held.write(b"x"))

    def test_close_unregisters_it(self):
        self.held.close()
        self.assertIsNone(self.request.producer)
        self.assertFalse(self.held.write(b"x"))
        self.held.close()  # twice is once
