"""
Asks wait their turn (``opencode.queue``): bounds per opencode server and per
account, the order kept, each waiting ask told how many are ahead (again every
``repeat`` seconds), leaving while waiting; and through ``Asks``: the waiting
partial, cancel while waiting, and no timeout while waiting.
"""

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.exposition import generate_latest
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from tests.unit.opencode.helpers import AskTestsMixin
from trapsandbox import errors, limits
from trapsandbox.errors import GatewayError
from trapsandbox.opencode.client import OpencodeClient
from trapsandbox.opencode.queue import AskQueue, Ticket


class QueueTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.queue = AskQueue(self.clock, per_server=2, per_account=2, repeat=60)
        self.told = {}
        self.started = []

    def enter(self, name, account="a", server="s"):
        ticket = self.queue.enter(
            Ticket(server, account, lambda ahead: self.told.setdefault(name, []).append(ahead))
        )
        ticket.granted.addCallback(lambda _: self.started.append(name))
        ticket.granted.addErrback(lambda f: f.trap(CancelledError))
        return ticket

    def test_past_the_bound_asks_wait_in_order_told_how_many_are_ahead(self):
        first, second = self.enter("1"), self.enter("2", account="b")
        third, fourth = self.enter("3", account="c"), self.enter("4", account="d")
        self.assertEqual(self.started, ["1", "2"])
        self.assertEqual(self.told, {"3": [0], "4": [1]})
        self.queue.leave(first)
        self.assertEqual(self.started, ["1", "2", "3"])
        self.assertEqual(self.told, {"3": [0], "4": [1, 0]})
        self.queue.leave(second)
        self.queue.leave(third)
        self.queue.leave(fourth)
        self.assertEqual(self.started, ["1", "2", "3", "4"])
        self.assertEqual((self.queue.running_on, self.queue.running_of), ({}, {}))
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_an_account_at_its_bound_does_not_hold_up_the_others(self):
        self.queue.per_server = 10
        a1, a2, a3 = self.enter("a1"), self.enter("a2"), self.enter("a3")
        b1 = self.enter("b1", account="b")
        self.assertEqual(self.started, ["a1", "a2", "b1"])
        self.assertEqual(self.told, {"a3": [0]})
        self.queue.leave(a1)
        self.assertEqual(self.started, ["a1", "a2", "b1", "a3"])
        for ticket in (a2, a3, b1):
            self.queue.leave(ticket)

    def test_each_server_has_its_own_bound(self):
        self.queue.per_account = 10
        for n in range(3):
            self.enter(f"s{n}")
        self.enter("t0", server="t")
        self.assertEqual(self.started, ["s0", "s1", "t0"])
        self.assertEqual(self.told, {"s2": [0]})

    def test_a_waiting_ask_is_told_again_while_it_waits(self):
        self.enter("1")
        self.enter("2")
        self.enter("3")
        self.clock.advance(60)
        self.clock.advance(60)
        self.assertEqual(self.told, {"3": [0, 0, 0]})

    def test_a_waiting_ask_is_told_again_once_its_place_has_halved(self):
        self.queue.per_account = 1000
        running = [self.enter(f"r{n}", account=f"r{n}") for n in range(2)]
        waiting = [self.enter(f"w{n}", account=f"w{n}") for n in range(157)]
        self.assertEqual(self.told["w156"], [156])
        for ticket in running + waiting[:-1]:
            self.queue.leave(ticket)
        self.assertEqual(self.told["w156"], [156, 78, 39, 19, 9, 4, 2, 1, 0])
        self.assertEqual(self.told["w12"], [12, 6, 3, 1, 0])
        # 157 waiting: 1,158 messages in all, where the leading figure took 2,545 and
        # telling every change 12,403.
        self.assertEqual(sum(len(told) for told in self.told.values()), 1158)
        self.assertEqual(self.started[-1], "w156")

    def test_the_repeat_tells_a_waiting_ask_exactly_where_it_is(self):
        self.queue.per_account = 1000
        running = [self.enter(f"r{n}", account=f"r{n}") for n in range(2)]
        for n in range(20):
            self.enter(f"w{n}", account=f"w{n}")
        self.queue.leave(running[0])
        self.assertEqual(self.told["w19"], [19])  # 18: not half of 19, not told yet
        self.clock.advance(60)
        self.assertEqual(self.told["w19"], [19, 18])

    def test_leaving_while_waiting_moves_the_others_up(self):
        self.enter("1")
        self.enter("2", account="b")
        third = self.enter("3", account="c")
        self.enter("4", account="d")
        self.queue.leave(third)
        self.assertTrue(third.left)
        self.assertNotIn("3", self.started)
        self.assertEqual(self.told, {"3": [0], "4": [1, 0]})
        self.assertEqual(self.started, ["1", "2"])
        self.queue.leave(third)  # twice is once


class QueueModelTests(SynchronousTestCase):
    """Any asks entering and leaving, on any servers and accounts: after each step no waiting
    ask has room, each knows exactly how many wait ahead of it, and it was told so when it
    began waiting and whenever its place had halved since."""

    @settings(max_examples=200, deadline=None)
    @given(
        steps=st.lists(
            st.one_of(
                st.tuples(st.just("enter"), st.sampled_from("st"), st.sampled_from("abc")),
                st.tuples(st.just("leave"), st.integers(0, 40), st.just("")),
            ),
            max_size=60,
        ),
        per_server=st.integers(1, 3),
        per_account=st.integers(1, 3),
    )
    def test_places_and_room(self, steps, per_server, per_account):
        queue = AskQueue(Clock(), per_server=per_server, per_account=per_account)
        tickets, told = [], []
        for kind, which, account in steps:
            if kind == "enter":
                n = len(tickets)
                told.append([])
                ticket = Ticket(which, account, told[n].append)
                ticket.granted.addErrback(lambda f: f.trap(CancelledError))
                tickets.append(queue.enter(ticket))
            elif tickets:
                queue.leave(tickets[which % len(tickets)])
            running = [t for t in tickets if t.admitted and not t.left]
            for t in queue.waiting:
                self.assertFalse(
                    sum(r.server == t.server for r in running) < per_server
                    and sum(r.account == t.account for r in running) < per_account
                )
            for i, t in enumerate(queue.waiting):
                ahead = sum(
                    o.server == t.server or o.account == t.account for o in queue.waiting[:i]
                )
                self.assertEqual(t.ahead, ahead)
        for n, ticket in enumerate(tickets):
            heard = told[n]
            for before, after in zip(heard, heard[1:], strict=False):
                self.assertLessEqual(after, before // 2)
            if heard and not ticket.left and not ticket.admitted:
                # Not due another: where it was told, or not yet halved.
                self.assertTrue(ticket.ahead == heard[-1] or ticket.ahead > heard[-1] // 2)


class AskQueueTests(AskTestsMixin, SynchronousTestCase):
    def setUp(self):
        super().setUp()
        self.asks_with(queue=AskQueue(self.clock, per_server=1, per_account=1))

    def test_an_ask_waits_told_its_place_and_no_timeout_runs_meanwhile(self):
        first = self.ask()
        second = self.ask(trapos="2:b", message_id="m2")
        self.assertEqual(self.partials, [{"type": "waiting", "ahead": 0}])
        self.assertEqual(self.http.sessions, 1)  # nothing of the second reached opencode
        self.clock.advance(limits.ASK_TIMEOUT * 3)  # the first ran out of time; not the second
        self.assertEqual(self.failureResultOf(first, GatewayError).value.code, errors.TIMEOUT)
        self.assertNoResult(second)
        self.assertEqual(self.http.sessions, 2)  # its turn came
        self.clock.advance(limits.ASK_TIMEOUT - 1)
        self.assertNoResult(second)
        self.clock.advance(1)
        self.assertEqual(self.failureResultOf(second, GatewayError).value.code, errors.TIMEOUT)

    def test_cancel_while_waiting_ends_it_and_nothing_reaches_opencode(self):
        self.ask()
        second = self.ask(trapos="2:b", message_id="m2")
        self.successResultOf(self.asks.cancel("local", "2:b", "m2"))
        error = self.failureResultOf(second, GatewayError).value
        self.assertEqual(error.code, errors.CANCELLED)
        self.assertIn("while waiting", error.message)
        self.assertEqual(self.http.sessions, 1)
        self.assertNotIn(("local", "2:b"), self.asks.runs)
        self.assertEqual(self.outcome("cancelled"), 1)

    def test_a_computer_that_left_while_waiting_leaves_the_queue(self):
        self.ask()

        def gone(message):
            raise GatewayError(errors.NOT_CONNECTED, "gone")

        second = Deferred.fromCoroutine(
            self.asks.ask("local", "2:b", frozenset(), "m2", {"prompt": "x"}, gone)
        )
        self.assertEqual(
            self.failureResultOf(second, GatewayError).value.code, errors.NOT_CONNECTED
        )
        self.assertEqual(self.asks.queue.waiting, [])
        self.assertEqual([p for p in self.http.paths("POST") if p.endswith("/abort")], [])

    def test_a_player_stopping_the_agent_while_it_waits_ends_it(self):
        self.ask()
        second = self.ask(trapos="2:b", message_id="m2")
        self.assertTrue(self.asks.halt("local", "2:b", GatewayError(errors.STOPPED, "stopped")))
        self.assertEqual(self.failureResultOf(second, GatewayError).value.code, errors.STOPPED)
        self.assertEqual(self.asks.queue.waiting, [])
        self.assertEqual(self.http.sessions, 1)


class QueueMetricsTests(AskTestsMixin, SynchronousTestCase):
    """``/metrics`` reads the asks waiting and running per server, its URL without secrets."""

    def setUp(self):
        super().setUp()
        self.client = OpencodeClient(self.http, self.clock, "http://oc:s3cret@127.0.0.1:4096")
        self.asks_with(queue=AskQueue(self.clock, per_server=1, per_account=5))

    def gauge(self, name):
        return self.metrics.registry.get_sample_value(name, {"server": "http://127.0.0.1:4096"})

    def test_asks_waiting_and_running_per_server(self):
        self.assertEqual(self.gauge("trapsandbox_asks_waiting"), 0)
        first = self.ask()
        second = self.ask(trapos="2:b", message_id="m2")
        third = self.ask(trapos="3:c", message_id="m3")
        self.assertEqual(self.gauge("trapsandbox_asks_waiting"), 2)
        self.assertEqual(self.gauge("trapsandbox_asks_running"), 1)
        self.successResultOf(self.asks.cancel("local", "3:c", "m3"))
        self.failureResultOf(third, GatewayError)
        self.assertEqual(self.gauge("trapsandbox_asks_waiting"), 1)
        exposed = generate_latest(self.metrics.registry).decode()
        self.assertNotIn("s3cret", exposed)
        self.asks.stop()
        self.failureResultOf(first, GatewayError)
        self.failureResultOf(second, GatewayError)
        self.assertEqual(self.gauge("trapsandbox_asks_waiting"), 0)
        self.assertEqual(self.gauge("trapsandbox_asks_running"), 0)
