"""
Resource subscriptions (SPEC §17, ``trapsandbox.mcp.subscriptions``): a
screen's subscribers hear of its changes at most once a second from one
screen watch, stopped with the last of them; a file's when a write through
the gateway changes it; never another account's computer.
"""

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from tests.harness.callers import asking, mcp_caller
from tests.harness.fakes import SandboxComputer
from trapsandbox import errors
from trapsandbox.computers.callers import Caller, Sender
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.errors import GatewayError
from trapsandbox.mcp.errors import Invalid
from trapsandbox.mcp.jsonrpc import Call
from trapsandbox.mcp.revision import Revision
from trapsandbox.mcp.stream import EventStream
from trapsandbox.mcp.subscriptions import Subscriptions

SCREEN = "trapsandbox://7%3Abase/screen"
FILE = "trapsandbox://7%3Abase/files/notes/a.txt"


class WatchedComputer(SandboxComputer):
    """A computer whose screen_watch the test drives: ``frame`` sends one."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.watches = []

    def on_screen_watch(self, request, payload):
        self.watches.append(request)

    def frame(self, line="x"):
        for watch in self.watches:
            self.answer(
                watch, payload={"type": "screen", "rows": {"1": {"line": line}}}, partial=True
            )


class Stream:
    def __init__(self):
        self.sent = []
        self.stalled = Deferred()  # fired by a test: the reader stopped reading

    def send(self, message):
        self.sent.append(message)

    def comment(self):
        self.sent.append(None)

    keep_alive = EventStream.keep_alive  # the real one, on this fake's comment


class SubscriptionTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.registry = Registry(self.clock, request_timeout=60)
        self.sandbox = Sandbox(self.registry)
        self.subscriptions = Subscriptions(self.registry, self.sandbox, self.clock)
        self.computer = WatchedComputer.connect(self.registry, "7:base", account_id="alice")

    def listen(self, uris, scope="alice", id=1):
        stream = Stream()
        call = Call(id, revision=Revision("2026-07-28", True), stream=stream)
        params = {"notifications": {"resourceSubscriptions": uris}}
        d = Deferred.fromCoroutine(self.subscriptions.listen(params, call, mcp_caller(scope)))
        return stream, d

    def end(self, d):
        """The client closes its stream: the listen request is cancelled."""
        d.cancel()
        self.failureResultOf(d, CancelledError)

    def updates(self, stream):
        return [m["params"]["uri"] for m in stream.sent if m and m["method"].endswith("updated")]

    def test_listen_acknowledges_first_with_its_subscription_id(self):
        stream, d = self.listen([SCREEN, FILE, "trapsandbox://9/screen", "test://x"], id="s1")
        [ack] = stream.sent
        self.assertEqual(ack["method"], "notifications/subscriptions/acknowledged")
        self.assertEqual(ack["params"]["notifications"], {"resourceSubscriptions": [SCREEN, FILE]})
        self.assertEqual(ack["params"]["_meta"], {"io.modelcontextprotocol/subscriptionId": "s1"})
        self.assertNoResult(d)
        self.end(d)

    def test_a_screen_updates_at_most_once_a_second_and_its_watch_ends_with_the_last(self):
        first, d1 = self.listen([SCREEN])
        second, d2 = self.listen([SCREEN])
        self.assertEqual(len(self.computer.watches), 1)  # one watch, however many listen
        self.computer.frame("whole screen")  # the first frame is the screen as it is
        self.clock.advance(1)  # (the registry paces a watch's frames)
        self.assertEqual(self.updates(first), [])
        self.computer.frame("a")
        self.clock.advance(1)
        self.assertEqual(self.updates(first), [SCREEN])
        self.assertEqual(self.updates(second), [SCREEN])
        # A frame every 0.1 s for 3 s: updates come at least a second apart.
        times = []
        for n in range(30):
            self.computer.frame(str(n))
            before = len(self.updates(first))
            self.clock.advance(0.1)
            if len(self.updates(first)) > before:
                times.append(self.clock.seconds())
        self.assertTrue(2 <= len(times) <= 3, times)
        self.assertTrue(all(b - a > 0.999 for a, b in zip(times, times[1:], strict=False)), times)
        meta = {"io.modelcontextprotocol/subscriptionId": 1}
        self.assertEqual(first.sent[-1]["params"]["_meta"], meta)
        self.end(d1)
        self.assertEqual(self.subscriptions.watching(), 1)
        self.end(d2)
        self.assertEqual(self.subscriptions.watching(), 0)
        cancels = [r for r in self.computer.sent if r["type"] == "cancel"]
        self.assertEqual(len(cancels), 1)
        self.clock.advance(60)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_write_through_the_gateway_updates_a_file(self):
        stream, d = self.listen([FILE])
        self.successResultOf(
            self.sandbox.write_file(asking("7:base", "alice"), "/notes/b.txt", b"1")
        )
        self.assertEqual(self.updates(stream), [])
        self.successResultOf(
            self.sandbox.write_file(asking("7:base", "alice"), "notes/a.txt", b"1")
        )
        self.assertEqual(self.updates(stream), [FILE])
        self.successResultOf(self.sandbox.delete_file(asking("7:base", "alice"), "/notes"))
        self.assertEqual(self.updates(stream), [FILE, FILE])
        self.end(d)
        self.successResultOf(
            self.sandbox.write_file(asking("7:base", "alice"), "notes/a.txt", b"2")
        )
        self.assertEqual(self.updates(stream), [FILE, FILE])

    def test_a_write_from_any_surface_updates_a_file_once_whole(self):
        # /operator and POST /computers/{id}/requests (the console's files panel) send the
        # computer's own request types straight through the registry, in parts.
        stream, d = self.listen([FILE])
        first = {"path": "notes/a.txt", "content": "", "encoding": "base64"}
        first["part"] = {"offset": 0, "final": False, "size": 1}
        self.successResultOf(
            self.registry.request(asking("7:base", "alice"), "write_file", first, 5)
        )
        self.assertEqual(self.updates(stream), [])  # not whole yet
        last = {**first, "content": "MQ==", "part": {"offset": 0, "final": True, "size": 1}}
        self.successResultOf(
            self.registry.request(asking("7:base", "alice"), "write_file", last, 5)
        )
        self.assertEqual(self.updates(stream), [FILE])
        self.end(d)

    def test_another_accounts_computer_is_never_watched(self):
        WatchedComputer.connect(self.registry, "7:base", account_id="bob")
        stream, d = self.listen([SCREEN, FILE], scope="mallory")
        self.assertEqual(stream.sent[0]["params"]["notifications"]["resourceSubscriptions"], [])
        self.assertEqual(self.computer.watches, [])
        self.successResultOf(
            self.sandbox.write_file(asking("7:base", "alice"), "notes/a.txt", b"1")
        )
        self.assertEqual(self.updates(stream), [])
        self.end(d)

    def test_a_screen_needs_its_capability(self):
        WatchedComputer.connect(self.registry, "8:", account_id="alice", capabilities=("exec",))
        stream, d = self.listen(["trapsandbox://8%3A/screen"])
        self.assertEqual(stream.sent[0]["params"]["notifications"]["resourceSubscriptions"], [])
        self.end(d)

    def test_a_quiet_stream_gets_a_keepalive(self):
        stream, d = self.listen([])
        self.clock.advance(15)
        self.assertEqual(stream.sent[-1], None)
        self.end(d)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_bad_filters_are_invalid_params(self):
        for notifications in (None, {"resourceSubscriptions": "x"}, {"resourceSubscriptions": [1]}):
            call = Call(1, revision=Revision("2026-07-28", True), stream=Stream())
            params = {"notifications": notifications}
            d = Deferred.fromCoroutine(self.subscriptions.listen(params, call, mcp_caller("alice")))
            self.failureResultOf(d, Invalid)

    def test_legacy_subscribe_and_unsubscribe(self):
        heard = []
        call = Call(1, connection=("caller", "s1"))
        detach = self.subscriptions.attach(("caller", "s1"), heard.append, lambda: None)
        legacy = self.subscriptions.legacy
        self.successResultOf(
            Deferred.fromCoroutine(
                legacy("resources/subscribe", {"uri": FILE}, call, mcp_caller("alice"))
            )
        )
        self.assertTrue(self.subscriptions.subscribed(("caller", "s1")))
        self.successResultOf(
            self.sandbox.write_file(asking("7:base", "alice"), "notes/a.txt", b"1")
        )
        self.assertEqual([m["params"]["uri"] for m in heard], [FILE])
        self.successResultOf(
            Deferred.fromCoroutine(
                legacy("resources/unsubscribe", {"uri": FILE}, call, mcp_caller("alice"))
            )
        )
        self.assertFalse(self.subscriptions.subscribed(("caller", "s1")))
        self.successResultOf(
            self.sandbox.write_file(asking("7:base", "alice"), "notes/a.txt", b"1")
        )
        self.assertEqual(len(heard), 1)
        missing = legacy(
            "resources/subscribe", {"uri": "trapsandbox://9/screen"}, call, mcp_caller("alice")
        )
        self.assertEqual(
            self.failureResultOf(Deferred.fromCoroutine(missing), Invalid).value.code, -32002
        )
        detach()

    # Issue 43: subscriptions held to the rules of every other long-lived stream.

    def operator_listen(self, uris, account="alice"):
        stream = Stream()
        call = Call(1, revision=Revision("2026-07-28", True), stream=stream)
        params = {"notifications": {"resourceSubscriptions": uris}}
        caller = Caller(account, None, Sender("agent", account))
        return stream, Deferred.fromCoroutine(self.subscriptions.listen(params, call, caller))

    def test_spellings_of_one_file_are_one_subscription(self):
        spellings = [
            FILE,
            "trapsandbox://7%3Abase/files/notes/./a.txt",
            "trapsandbox://7%3Abase/files//notes/a.txt",
            "trapsandbox://7%3Abase/files/notes/x/../a.txt",
        ]
        stream, d = self.listen(spellings)
        acknowledged = stream.sent[0]["params"]["notifications"]["resourceSubscriptions"]
        self.assertEqual(acknowledged, [FILE])
        self.successResultOf(
            self.sandbox.write_file(asking("7:base", "alice"), "notes/a.txt", b"1")
        )
        self.assertEqual(self.updates(stream), [FILE])
        self.end(d)

    def test_listens_are_counted_in_the_accounts_budget(self):
        self.registry.streams.most = 2
        held = [self.operator_listen([FILE]) for _ in range(2)]
        _, refused = self.operator_listen([FILE])
        invalid = self.failureResultOf(refused, Invalid).value
        self.assertEqual(invalid.status, 429)
        self.assertIn("already has 2 subscription watches open here", invalid.message)
        _, bobs = self.operator_listen([], account="bob")  # another account's are its own
        self.assertNoResult(bobs)
        self.end(held[0][1])
        _, again = self.operator_listen([FILE])
        self.assertNoResult(again)

    def test_a_listen_whose_reader_stops_reading_ends_and_lets_go(self):
        stream, d = self.operator_listen([SCREEN, FILE])
        self.assertEqual(len(self.computer.watches), 1)
        stream.stalled.callback(GatewayError(errors.OVERLOADED, "the reader is not reading"))
        invalid = self.failureResultOf(d, Invalid).value
        self.assertEqual(invalid.message, "the reader is not reading: listen again")
        self.assertEqual(self.registry.streams.holding("subscription", "alice"), 0)
        self.assertEqual(self.subscriptions.watching(), 0)  # its screen watch cancelled
        self.successResultOf(
            self.sandbox.write_file(asking("7:base", "alice"), "notes/a.txt", b"1")
        )
        self.assertEqual(self.updates(stream), [])

    def test_a_screen_watch_that_ends_ends_its_listens_and_a_new_listen_starts_another(self):
        stream, d = self.listen([SCREEN])
        [watch] = self.computer.watches
        self.computer.answer(watch, ok=False, error={"code": "ended", "message": "rebooted"})
        invalid = self.failureResultOf(d, Invalid).value
        self.assertEqual(
            invalid.message, "the screen watch of 7:base ended: rebooted: listen again"
        )
        self.assertEqual(self.subscriptions.watching(), 0)
        _, again = self.listen([SCREEN])
        self.assertEqual(len(self.computer.watches), 2)
        self.end(again)

    def test_a_legacy_screen_subscription_whose_watch_ends_can_be_made_again(self):
        heard = []
        connection = ("caller", "s1")
        call = Call(1, connection=connection)
        self.subscriptions.attach(connection, heard.append, lambda: None)

        def subscribe():
            d = self.subscriptions.legacy(
                "resources/subscribe", {"uri": SCREEN}, call, mcp_caller("alice")
            )
            self.successResultOf(Deferred.fromCoroutine(d))

        subscribe()
        [watch] = self.computer.watches
        self.computer.answer(watch, ok=False, error={"code": "ended", "message": "rebooted"})
        self.assertEqual([m["params"]["uri"] for m in heard], [SCREEN])  # read it again
        self.assertFalse(self.subscriptions.subscribed(connection))
        subscribe()  # not answered {} as if it were still there: a new watch
        self.assertEqual(len(self.computer.watches), 2)

    def test_a_second_get_stream_of_a_legacy_connection_ends_the_first(self):
        ended = []
        self.subscriptions.attach(("caller", "s1"), lambda m: None, lambda: ended.append(1))
        self.subscriptions.attach(("caller", "s1"), lambda m: None, lambda: ended.append(2))
        self.assertEqual(ended, [1])

    def test_an_evicted_legacy_connection_ends_its_get_stream_too(self):
        # Else an account could keep GET streams open past its budget: subscribe, open the
        # stream, be evicted by its own next connection, and again.
        self.registry.streams.most = 1
        caller = Caller("alice", None, Sender("agent", "alice"))
        ended = []

        def subscribe(connection):
            call = Call(1, connection=connection)
            d = self.subscriptions.legacy("resources/subscribe", {"uri": FILE}, call, caller)
            self.successResultOf(Deferred.fromCoroutine(d))
            self.subscriptions.attach(connection, lambda m: None, lambda: ended.append(connection))

        subscribe(("a", "1"))
        subscribe(("a", "2"))  # the account's bound: its oldest connection goes, stream and all
        self.assertEqual(ended, [("a", "1")])
        self.assertFalse(self.subscriptions.subscribed(("a", "1")))
        self.assertEqual(self.registry.streams.holding("subscription", "alice"), 1)
