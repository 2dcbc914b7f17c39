"""The timeouts of the requests in flight behind one timer (``session.Deadlines``)."""

import gc

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from tests.harness.fakes import FakeLink
from trapsandbox import errors
from trapsandbox.computers.session import Deadlines, Session, deadlines_of


class DeadlinesTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.clock.advance(1_700_000_000.1)
        self.deadlines = Deadlines(self.clock)
        self.expired = []

    def add(self, key, seconds):
        self.deadlines.add(key, seconds, self.expired.append, key)

    def test_each_expires_at_its_own_deadline_in_any_order_behind_one_timer(self):
        self.add("a", 30)
        self.clock.advance(1)
        self.add("b", 30)
        self.add("c", 0.5)  # due before every one before it
        self.add("d", 10)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        steps = [(0.5, ["c"]), (9.5 - 1e-3, []), (1e-3, ["d"]), (19, ["a"]), (1, ["b"])]
        for step, expired in steps:
            self.clock.advance(step)
            self.assertEqual(self.expired, expired)
            del self.expired[:]
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_one_discarded_never_expires_and_none_left_leaves_no_timer(self):
        self.add("a", 5)
        self.add("b", 7)
        self.deadlines.discard("a")
        self.clock.advance(5)
        self.assertEqual(self.expired, [])
        self.deadlines.discard("b")
        self.deadlines.discard("b")  # (again: nothing)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.clock.advance(10)
        self.assertEqual((self.expired, len(self.deadlines)), ([], 0))

    def test_an_expiry_may_add_and_end_others_and_one_that_raises_is_logged(self):
        def first():
            self.deadlines.discard("ended by the first")
            self.add("added by the first", 2)
            raise ValueError("a bug")

        self.deadlines.add("first", 1, first)
        self.add("ended by the first", 1)
        self.add("later", 1)
        self.clock.advance(1)
        self.assertEqual(self.expired, ["later"])
        self.assertEqual(len(self.flushLoggedErrors(ValueError)), 1)
        self.clock.advance(2)
        self.assertEqual(self.expired, ["later", "added by the first"])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_clock_and_its_deadlines_are_not_kept_alive_by_them(self):
        clock = Clock()
        deadlines_of(clock)
        count = len([o for o in gc.get_objects() if type(o) is Deadlines])
        del clock
        gc.collect()
        self.assertEqual(len([o for o in gc.get_objects() if type(o) is Deadlines]), count - 1)


class SessionTimeoutTests(SynchronousTestCase):
    def test_the_sessions_of_a_clock_share_one_timer_and_each_request_its_timeout(self):
        clock = Clock()
        sessions = [Session("local", f"{n}:", FakeLink(), clock) for n in range(3)]
        requests = [s.request("ping", {}, 30 - n) for n, s in enumerate(sessions)]
        self.assertEqual(len(clock.getDelayedCalls()), 1)
        clock.advance(28)
        self.assertEqual(self.failureResultOf(requests[2]).value.code, errors.TIMEOUT)
        self.assertNoResult(requests[0])
        self.assertNoResult(requests[1])
        clock.advance(1)
        self.assertEqual(self.failureResultOf(requests[1]).value.code, errors.TIMEOUT)
        requests[0].cancel()
        self.failureResultOf(requests[0])
        self.assertEqual(clock.getDelayedCalls(), [])
