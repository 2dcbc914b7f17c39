"""The registry: newest wins, correlation, timeouts, cleanup, limits."""

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from tests.harness.callers import asking
from tests.harness.fakes import FakeLink
from trapsandbox import errors, limits
from trapsandbox.computers import wire
from trapsandbox.computers.callers import Sender
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.session import Session
from trapsandbox.computers.streams import StreamBudget
from trapsandbox.errors import GatewayError
from trapsandbox.limits import LOCAL_ACCOUNT


def response(request, ok=True, payload=None, sender="7:"):
    return wire.ComputerResponse(sender, request["messageId"], request["type"], ok, payload)


class RegistryTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.registry = Registry(self.clock, request_timeout=30)

    def connect(self, trapos_id="7:", account_id="local"):
        link = FakeLink()
        session = Session(account_id, trapos_id, link, self.clock)
        self.registry.add(session)
        return session, link

    def assertGatewayError(self, d, code):
        failure = self.failureResultOf(d, GatewayError)
        self.assertEqual(failure.value.code, code)
        return failure.value

    def test_request_resolved_by_its_response(self):
        session, link = self.connect()
        d = self.registry.request(asking("7:"), "ping", {"x": 1})
        [sent] = link.sent
        self.assertEqual(sent["event"], "gateway_request")
        self.assertEqual((sent["traposReceiverId"], sent["type"]), ("7:", "ping"))
        self.assertEqual(sent["payload"], {"x": 1})
        self.assertNoResult(d)
        self.assertTrue(session.resolve(response(sent, payload={"traposId": "7:"})))
        self.assertEqual(self.successResultOf(d).payload, {"traposId": "7:"})
        self.assertEqual(session.in_flight, 0)

    def test_every_requests_paths_go_by_the_one_rule_whatever_sent_it(self):
        # Issue 43 review: the generic request route (/operator, POST .../requests) sent raw
        # file requests as they came; the registry now applies the rule to every request.
        link = FakeLink()
        session = Session("local", "7:", link, self.clock, capabilities={"fs.read", "fs.write"})
        self.registry.add(session)
        heard = []
        self.registry.file_listeners.append(lambda *changed: heard.append(changed))
        for kind, payload, code in (
            ("delete_file", {"path": "x/../rom/y"}, errors.FS_ERROR),
            ("delete_file", {"path": "/"}, errors.BAD_REQUEST),
            ("write_file", {"path": "a*b", "content": ""}, errors.BAD_REQUEST),
            ("read_file", {"path": "//.Settings"}, errors.FORBIDDEN),
            ("move_file", {"from": "/p", "to": "/q/../p/in"}, errors.BAD_REQUEST),
        ):
            self.assertGatewayError(self.registry.request(asking("7:"), kind, payload), code)
        self.assertEqual(link.sent, [])
        # Sent in one spelling, and a move that succeeded is heard on both its sides.
        d = self.registry.request(asking("7:"), "move_file", {"from": "a//b", "to": "./c/"})
        [sent] = link.sent
        self.assertEqual(sent["payload"], {"from": "/a/b", "to": "/c"})
        session.resolve(response(sent, payload={"moved": True}))
        self.successResultOf(d)
        self.assertEqual(heard, [("local", "7:", "/a/b"), ("local", "7:", "/c")])

    def test_ok_false_answer_is_a_result(self):
        session, link = self.connect()
        d = self.registry.request(asking("7:"), "x")
        session.resolve(
            wire.ComputerResponse(
                "7:", link.sent[0]["messageId"], "x", False, error=errors.Error("unknown_type", "?")
            )
        )
        self.assertFalse(self.successResultOf(d).ok)

    def test_message_ids_are_unique(self):
        _, link = self.connect()
        for _ in range(10):
            self.registry.request(asking("7:"), "ping")
        self.assertEqual(len({sent["messageId"] for sent in link.sent}), 10)

    def test_unknown_response_is_ignored(self):
        session, link = self.connect()
        d = self.registry.request(asking("7:"), "ping")
        self.assertFalse(session.resolve(wire.ComputerResponse("7:", "other", "ping", True)))
        self.assertNoResult(d)

    def test_response_on_another_connection_is_ignored(self):
        """Only the connection a request went out on can answer it."""
        session, link = self.connect("7:")
        other, _ = self.connect("8:")
        d = self.registry.request(asking("7:"), "ping")
        self.assertFalse(other.resolve(response(link.sent[0], sender="8:")))
        self.assertNoResult(d)
        session.resolve(response(link.sent[0]))
        self.successResultOf(d)

    def test_timeout(self):
        session, _ = self.connect()
        d = self.registry.request(asking("7:"), "ping", timeout=5)
        self.clock.advance(4.9)
        self.assertNoResult(d)
        self.clock.advance(0.2)
        error = self.assertGatewayError(d, errors.TIMEOUT)
        self.assertIn("5 s", error.message)
        self.assertEqual(session.in_flight, 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_default_timeout(self):
        self.connect()
        d = self.registry.request(asking("7:"), "ping")
        self.clock.advance(29)
        self.assertNoResult(d)
        self.clock.advance(1)
        self.assertGatewayError(d, errors.TIMEOUT)

    def test_late_response_after_timeout_is_ignored(self):
        session, link = self.connect()
        d = self.registry.request(asking("7:"), "ping", timeout=1)
        self.clock.advance(1)
        self.assertGatewayError(d, errors.TIMEOUT)
        self.assertFalse(session.resolve(response(link.sent[0])))

    def test_answer_cancels_the_timer(self):
        session, link = self.connect()
        self.registry.request(asking("7:"), "ping")
        session.resolve(response(link.sent[0]))
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_not_connected(self):
        error = self.assertGatewayError(
            self.registry.request(asking("9:"), "ping"), errors.NOT_CONNECTED
        )
        self.assertIn("9:", error.message)
        # An operator's traposId comes from a URL: echoed cut (SPEC §4).
        long_id = "9:" + "x" * 5000
        error = self.assertGatewayError(
            self.registry.request(asking(long_id), "ping"), errors.NOT_CONNECTED
        )
        self.assertLess(len(error.message), wire.ECHO_LIMIT + 30)

    def test_bad_timeout(self):
        self.connect()
        for timeout in (0, -1, float("nan")):
            self.assertGatewayError(
                self.registry.request(asking("7:"), "ping", timeout=timeout), errors.BAD_REQUEST
            )

    def test_removal_fails_pending_requests(self):
        session, _ = self.connect()
        d = self.registry.request(asking("7:"), "ping")
        self.registry.remove(session)
        self.assertGatewayError(d, errors.NOT_CONNECTED)
        self.assertEqual(len(self.registry), 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_newest_wins(self):
        old, old_link = self.connect()
        d = self.registry.request(asking("7:"), "ping")
        new, new_link = self.connect()
        self.assertIs(self.registry.find(LOCAL_ACCOUNT, "7:"), new)
        self.assertEqual(old_link.closed, [(wire.CLOSE_REPLACED, "replaced")])
        self.assertGatewayError(d, errors.NOT_CONNECTED)
        # The old connection's close must not unregister the new one.
        self.registry.remove(old)
        self.assertIs(self.registry.find(LOCAL_ACCOUNT, "7:"), new)
        self.assertEqual(len(self.registry), 1)

    def test_accounts_are_separate(self):
        self.connect("7:", "a")
        _, link_b = self.connect("7:", "b")
        self.assertEqual(len(self.registry), 2)
        self.assertEqual(link_b.closed, [])
        self.assertGatewayError(self.registry.request(asking("7:"), "ping"), errors.NOT_CONNECTED)
        self.registry.request(asking("7:", "b"), "ping")
        self.assertEqual(len(link_b.sent), 1)

    def test_in_flight_cap(self):
        session, link = self.connect()
        for _ in range(64):
            self.registry.request(asking("7:"), "ping")
        self.assertGatewayError(self.registry.request(asking("7:"), "ping"), errors.OVERLOADED)
        self.assertEqual(len(link.sent), 64)
        session.resolve(response(link.sent[0]))
        self.assertNoResult(self.registry.request(asking("7:"), "ping"))

    def test_too_large(self):
        _, link = self.connect()
        d = self.registry.request(asking("7:"), "big", {"data": "x" * limits.MAX_OUTBOUND_BYTES})
        self.assertGatewayError(d, errors.TOO_LARGE)
        self.assertEqual(link.sent, [])

    def test_just_fits(self):
        _, link = self.connect()
        empty = len(wire.encode(wire.GatewayRequest("7:", "x" * 36, "big", {"data": ""})))
        filler = "x" * (limits.MAX_OUTBOUND_BYTES - empty)
        self.assertNoResult(self.registry.request(asking("7:"), "big", {"data": filler}))
        self.assertEqual(len(link.sent), 1)

    def test_unencodable_payload(self):
        self.connect()
        self.assertGatewayError(
            self.registry.request(asking("7:"), "x", {"n": 2**70}), errors.BAD_REQUEST
        )

    def test_send_on_a_closed_link(self):
        session, link = self.connect()
        link.open = False
        self.assertGatewayError(self.registry.request(asking("7:"), "ping"), errors.NOT_CONNECTED)
        self.assertEqual(session.in_flight, 0)

    def test_reject_fails_one_request(self):
        session, link = self.connect()
        d1 = self.registry.request(asking("7:"), "a")
        d2 = self.registry.request(asking("7:"), "b")
        error = errors.NOT_CONNECTED
        self.assertTrue(session.reject(link.sent[0]["messageId"], GatewayError(error, "x")))
        self.assertGatewayError(d1, error)
        self.assertNoResult(d2)

    def test_caller_cancel_forgets_the_request(self):
        session, _ = self.connect()
        d = self.registry.request(asking("7:"), "ping")
        d.cancel()
        self.failureResultOf(d)
        self.assertEqual(session.in_flight, 0)


def partial(request, payload, sender="7:"):
    return wire.ComputerResponse(
        sender, request["messageId"], request["type"], True, payload, partial=True
    )


def token_of(account, trapos_id):
    """A caller with ``account``'s token, aimed at its ``trapos_id``."""
    return asking(trapos_id, account, Sender("operator", account))


class WatchBoundTests(SynchronousTestCase):
    """Issue 35: what one account's token can make the gateway watch is bounded."""

    def setUp(self):
        self.clock = Clock()
        self.registry = Registry(self.clock, request_timeout=30, streams=StreamBudget(most=3))

    def connect(self, trapos_id="7:", account_id="alice", capabilities=("screen", "peripheral")):
        link = FakeLink()
        session = Session(
            account_id, trapos_id, link, self.clock, capabilities=frozenset(capabilities)
        )
        self.registry.add(session)
        return session, link

    def test_screen_and_event_watches_are_bounded_per_account(self):
        self.connect("1:")
        self.connect("2:")
        self.connect("1:", account_id="bob")
        request = self.registry.request
        held = [
            request(token_of("alice", "1:"), "screen_watch"),
            request(token_of("alice", "2:"), "peripheral_events"),
            request(token_of("alice", "2:"), "screen_watch"),
        ]
        refused = request(token_of("alice", "1:"), "screen_watch")
        error = self.failureResultOf(refused, GatewayError).value
        self.assertEqual(error.code, errors.TOO_MANY_WATCHES)
        self.assertEqual(
            error.message,
            "account alice already has 3 screen and event watches open here; end one first",
        )
        # Another account's are its own; other requests are not watches; the admin is not bound.
        self.assertNoResult(request(token_of("bob", "1:"), "screen_watch"))
        self.assertNoResult(request(token_of("alice", "1:"), "ping"))
        self.assertNoResult(request(asking("1:", "alice"), "screen_watch"))
        # One ends: one more may start.
        held[0].cancel()
        self.failureResultOf(held[0])
        self.assertNoResult(request(token_of("alice", "1:"), "screen_watch"))

    def test_activity_watches_are_bounded_per_account(self):
        def watch(account, trapos_id):
            return self.registry.activity.watch(token_of(account, trapos_id), lambda e: None)

        stops = [watch("alice", f"{n}:") for n in range(3)]
        with self.assertRaises(GatewayError) as raised:
            watch("alice", "9:")
        self.assertEqual(raised.exception.code, errors.TOO_MANY_WATCHES)
        watch("bob", "9:")
        self.registry.activity.watch(asking("9:", "alice"), lambda e: None)  # the admin's
        stops[0]()
        stops[0]()  # twice is once
        watch("alice", "9:")
        with self.assertRaises(GatewayError):
            watch("alice", "9:")

    def test_a_stopped_activity_watch_stopped_again_leaves_a_newer_one_alone(self):
        first = self.registry.activity.watch(token_of("alice", "1:"), lambda e: None)
        first()
        self.registry.activity.watch(token_of("alice", "1:"), lambda e: None)
        first()  # its list was emptied, then a newer watch made its own
        self.assertTrue(self.registry.activity.watching(("alice", "1:")))

    def test_a_relayed_activity_watch_past_the_bound_fails(self):
        self.connect("1:")
        for n in range(3):
            self.registry.activity.watch(token_of("alice", f"{n}:"), lambda e: None)
        d = self.registry.follow_activity(token_of("alice", "1:"), lambda e: None)
        self.assertEqual(self.failureResultOf(d, GatewayError).value.code, errors.TOO_MANY_WATCHES)

    def test_screen_frames_are_paced_to_max_fps(self):
        session, link = self.connect("1:")
        frames = []
        d = self.registry.request(
            asking("1:", "alice"), "screen_watch", {"maxFps": 5}, on_partial=frames.append
        )
        [watch] = link.sent
        for n in range(100):
            session.resolve(partial(watch, {"cursorX": n, "rows": {"1": {"line": str(n)}}}, "1:"))
        self.assertEqual([f["cursorX"] for f in frames], [0])
        self.clock.advance(0.2)
        self.assertEqual([f["cursorX"] for f in frames], [0, 99])
        d.cancel()
        self.failureResultOf(d)
        # Only the cancel sent to the computer waits: no frame is held for a watch that ended.
        waiting = [c.func.__name__ for c in self.clock.getDelayedCalls() if c.active()]
        self.assertEqual(waiting, ["_timed_out"])

    def test_a_frame_too_large_ends_the_watch_here_and_on_the_computer(self):
        session, link = self.connect("1:")
        frames = []
        d = self.registry.request(
            token_of("alice", "1:"), "screen_watch", {}, on_partial=frames.append
        )
        [watch] = link.sent
        session.resolve(partial(watch, {"width": 4000, "height": 3, "rows": {}}, "1:"))
        error = self.failureResultOf(d, GatewayError).value
        self.assertEqual(error.code, errors.TOO_LARGE)
        self.assertEqual(frames, [])
        cancel = link.sent[-1]
        self.assertEqual(
            (cancel["type"], cancel["payload"]), ("cancel", {"messageId": watch["messageId"]})
        )
        self.assertEqual(session.in_flight, 1)  # the cancel, nothing else
        # What the computer still sends for it is ignored.
        self.assertFalse(session.resolve(partial(watch, {"rows": {}}, "1:")))
        # And the account's watch is counted no more.
        self.assertEqual(self.registry.streams.holding("screen and event", "alice"), 0)
