"""
Several opencode servers (``opencode.servers``): a computer's asks go to the
first of its stable ranking, stay with its conversation, pass over a server
that does not answer (the player told the conversation starts afresh), end
when their server is gone mid-answer; ``/health`` tells each server's state.
"""

import os

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from tests.unit.opencode.helpers import FakeHTTP, FakeResponse, build_asks
from trapsandbox import errors, limits
from trapsandbox.errors import GatewayError
from trapsandbox.opencode.client import OpencodeClient
from trapsandbox.opencode.probe import OpencodeProbe
from trapsandbox.opencode.servers import ServerProbes, ranked
from trapsandbox.ops.metrics import Metrics

URLS = ("http://127.0.0.1:4096", "http://127.0.0.1:4097")


class Refusing(FakeHTTP):
    """A FakeHTTP whose server can be taken down: then every request is refused."""

    def __init__(self):
        super().__init__()
        self.down = False

    def request(self, method, url, **kwargs):
        if self.down:
            return fail(ConnectionRefusedError())
        return super().request(method, url, **kwargs)

    def get(self, url, **kwargs):
        if self.down:
            return fail(ConnectionRefusedError())
        return super().get(url, **kwargs)


class RankingTests(SynchronousTestCase):
    def test_the_ranking_is_stable_spread_and_moves_only_a_removed_servers_computers(self):
        class S:
            def __init__(self, url):
                self.url = url

        servers = [S(f"http://oc{n}:4096") for n in range(3)]
        keys = [("local", f"{n}:c") for n in range(300)]
        first = {key: ranked(servers, *key)[0] for key in keys}
        self.assertEqual(first, {key: ranked(list(reversed(servers)), *key)[0] for key in keys})
        counts = [sum(1 for s in first.values() if s is server) for server in servers]
        self.assertTrue(all(60 < count < 140 for count in counts), counts)
        fewer = servers[:2]
        for key, server in first.items():
            if server is not servers[2]:
                self.assertIs(ranked(fewer, *key)[0], server)


class SeveralServersTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.https = {url: Refusing() for url in URLS}
        clients = [OpencodeClient(self.https[url], self.clock, url) for url in URLS]
        root = os.path.abspath(self.mktemp())
        os.mkdir(root, 0o700)
        self.asks = build_asks(clients, self.clock, Metrics(), directory=root)
        self.partials = []

    def ask(self, trapos="1:a", message_id="m1", **payload):
        return Deferred.fromCoroutine(
            self.asks.ask(
                "local",
                trapos,
                frozenset(),
                message_id,
                {"prompt": "hi", **payload},
                self.partials.append,
            )
        )

    def home(self, trapos="1:a"):
        """The URL of the server a computer's asks go to first, and the other."""
        order = ranked(self.asks.servers, "local", trapos)
        return order[0].url, order[1].url

    def finish(self, http, session="ses_1"):
        http.event("session.status", sessionID=session, status={"type": "busy"})
        http.event("session.idle", sessionID=session)

    def test_asks_go_to_the_computers_server_and_stay_there(self):
        home, other = self.home()
        d = self.ask()
        self.finish(self.https[home])
        self.successResultOf(d)
        d = self.ask(message_id="m2")
        self.finish(self.https[home])
        self.successResultOf(d)
        self.assertEqual(self.https[home].sessions, 1)
        self.assertEqual(self.https[other].calls, [])

    def test_a_server_down_is_passed_over_and_the_player_told_the_conversation_starts_afresh(
        self,
    ):
        home, other = self.home()
        d = self.ask()
        self.finish(self.https[home])
        self.successResultOf(d)
        self.https[home].down = True
        self.https[home].drop()
        d = self.ask(message_id="m2")
        self.finish(self.https[other])
        self.successResultOf(d)
        (notice,) = [p for p in self.partials if "afresh" in p.get("text", "")]
        self.assertIn(f"opencode at {home} is not answering", notice["text"])
        self.assertEqual(self.https[other].sessions, 1)
        (conversation,) = self.asks.conversations.values()
        self.assertEqual(conversation.server.url, other)
        # The home server back: the conversation stays where it now is.
        self.https[home].down = False
        d = self.ask(message_id="m3")
        self.finish(self.https[other])
        self.successResultOf(d)
        self.assertEqual(self.https[home].sessions, 1)

    def test_every_server_down_is_a_clear_error(self):
        for http in self.https.values():
            http.down = True
        error = self.failureResultOf(self.ask(), GatewayError).value
        self.assertEqual(error.code, errors.OPENCODE_ERROR)
        self.assertIn("connection refused", error.message)
        self.assertEqual(self.asks.runs, {})

    def test_a_running_ask_whose_server_is_gone_ends_saying_the_next_goes_elsewhere(self):
        home, _ = self.home()
        d = self.ask()
        self.https[home].down = True
        self.https[home].drop()
        self.assertNoResult(d)
        self.clock.advance(limits.ASK_SERVER_GONE - 0.01)  # the stream's retries, refused
        self.assertNoResult(d)  # a restart is bridged ...
        self.clock.advance(0.01)  # ... a server gone is not: at ASK_SERVER_GONE, not later
        error = self.failureResultOf(d, GatewayError).value
        self.assertEqual(error.code, errors.OPENCODE_ERROR)
        self.assertIn("cut off", error.message)
        self.assertIn("the next ask goes to another opencode server", error.message)


class ServerProbesTests(SynchronousTestCase):
    def test_ok_while_one_is_up_and_the_detail_names_those_down(self):
        clock = Clock()

        class Up:
            def get(self, url, **kwargs):
                response = FakeResponse(200, b"{}")
                response.headers.setRawHeaders(b"content-type", [b"application/json"])
                return succeed(response)

        up = Up()

        class Down:
            def get(self, url, **kwargs):
                return fail(ConnectionRefusedError())

        probes = ServerProbes(
            [OpencodeProbe(up, clock, URLS[0]), OpencodeProbe(Down(), clock, URLS[1])]
        )
        result = self.successResultOf(probes.check())
        self.assertTrue(result.ok)
        self.assertEqual(
            [(s["url"], s["ok"]) for s in result.payload["opencodeServers"]],
            [(URLS[0], True), (URLS[1], False)],
        )
        self.assertIn(
            "1 of 2 opencode servers up; down: " + URLS[1], result.payload["opencodeDetail"]
        )
        self.assertIsNone(probes.fresh())  # a failure is never reused

    def test_a_fresh_answer_is_combined_once_until_a_probe_has_a_new_one(self):
        clock = Clock()

        class Up:
            def get(self, url, **kwargs):
                response = FakeResponse(200, b"{}")
                response.headers.setRawHeaders(b"content-type", [b"application/json"])
                return succeed(response)

        probes = ServerProbes([OpencodeProbe(Up(), clock, url) for url in URLS])
        self.successResultOf(probes.check())
        first = probes.fresh()
        self.assertIsNotNone(first)
        self.assertIs(probes.fresh(), first)  # every probe_gateway: no new dicts
        clock.advance(3600)  # both stale: probed anew, each a new answer
        self.assertIsNone(probes.fresh())
        self.successResultOf(probes.check())
        again = probes.fresh()
        self.assertIsNot(again, first)
        self.assertEqual(again.payload, first.payload)

    def test_all_down_is_not_ok(self):
        clock = Clock()

        class Down:
            def get(self, url, **kwargs):
                return fail(ConnectionRefusedError())

        probes = ServerProbes([OpencodeProbe(Down(), clock, url) for url in URLS])
        result = self.successResultOf(probes.check())
        self.assertFalse(result.ok)
        self.assertIn("0 of 2", result.payload["opencodeDetail"])


class OneServerGoneTests(SynchronousTestCase):
    def test_a_running_ask_whose_only_server_is_gone_ends_saying_to_ask_again_later(self):
        clock = Clock()
        http = Refusing()
        root = os.path.abspath(self.mktemp())
        os.mkdir(root, 0o700)
        asks = build_asks(OpencodeClient(http, clock, URLS[0]), clock, Metrics(), directory=root)
        d = Deferred.fromCoroutine(
            asks.ask("local", "1:a", frozenset(), "m1", {"prompt": "hi"}, lambda _: None)
        )
        http.down = True
        http.drop()
        clock.advance(limits.ASK_SERVER_GONE)
        error = self.failureResultOf(d, GatewayError).value
        self.assertIn("ask again once it is back", error.message)
        self.assertEqual(asks.runs, {})
