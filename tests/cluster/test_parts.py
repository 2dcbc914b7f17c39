"""The cluster's parts on a fake Redis: fencing by epoch, in ownership and in the relay."""

from __future__ import annotations

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from tests.harness.fakes import FakeLink
from trapsandbox import errors
from trapsandbox.cluster.ownership import CLAIM, Ownership
from trapsandbox.cluster.relay import Relay
from trapsandbox.computers import wire
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.session import Session
from trapsandbox.errors import GatewayError


class FakeRedis:
    """Connected and subscribed; each ``CLAIM`` waits on a Deferred the test fires."""

    connected = subscribed = ok = True

    def __init__(self) -> None:
        self.claims: list[Deferred] = []
        self.published: list[tuple[str, dict]] = []

    def call(self, method, *args):
        if method == "eval" and args[0] == CLAIM:
            self.claims.append(Deferred())
            return self.claims[-1]
        return succeed(1)

    def publish(self, instance, message):
        self.published.append((instance, message))
        return succeed(1)


class FencingTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.redis = FakeRedis()
        self.registry = Registry(self.clock)
        self.ownership = Ownership(self.registry, self.redis, "here", 15000, self.clock)
        self.registry.peers = self.ownership
        self.relay = Relay(self.registry, self.redis, self.ownership, "here", self.clock)

    def connect(self, trapos_id="7:"):
        link = FakeLink()
        session = Session("local", trapos_id, link, self.clock)
        self.registry.add(session)
        return session, link

    def test_a_claim_tells_the_previous_owner_and_holds_the_epoch(self):
        session, _ = self.connect()
        self.redis.claims[0].callback([3, "there|2"])
        self.assertEqual(self.ownership.epoch_of(session), 3)
        self.assertEqual(
            self.redis.published, [("there", {"t": "evict", "key": ("local", "7:"), "epoch": 3})]
        )

    def test_an_older_eviction_leaves_ours_and_a_newer_one_closes_it(self):
        session, link = self.connect()
        self.redis.claims[0].callback([3, ""])
        self.ownership.on_evict({"t": "evict", "key": ["local", "7:"], "epoch": 2})
        self.assertEqual((link.closed, len(self.registry)), ([], 1))
        self.ownership.on_evict({"t": "evict", "key": ["local", "7:"], "epoch": 4})
        self.assertEqual(link.closed, [(wire.CLOSE_REPLACED, "replaced")])
        self.assertEqual(len(self.registry), 0)
        self.assertIsNone(self.ownership.epoch_of(session))

    def test_an_eviction_before_our_claim_answers_closes_ours_once_it_does(self):
        _, link = self.connect()
        self.ownership.on_evict({"t": "evict", "key": ["local", "7:"], "epoch": 5})
        self.assertEqual(link.closed, [])
        self.redis.claims[0].callback([4, "there|3"])
        self.assertEqual(link.closed, [(wire.CLOSE_REPLACED, "replaced")])
        self.assertEqual(self.redis.published, [])  # nobody to evict: the newer one is theirs

    def test_replaced_before_our_claim_is_answered_its_hello_is_answered_first(self):
        """A newer hello elsewhere: ours is answered, then closed 4000, as when replaced later."""
        session, link = self.connect()
        seen = []
        self.ownership.claim_answered(session).addCallback(lambda _: seen.append(link.closed[:]))
        self.ownership.on_evict({"t": "evict", "key": ["local", "7:"], "epoch": 5})
        self.redis.claims[0].callback([4, "there|3"])
        self.assertEqual(seen, [[]])
        self.assertEqual(link.closed, [(wire.CLOSE_REPLACED, "replaced")])

    def test_replaced_here_before_our_claim_is_answered_its_hello_is_answered_first(self):
        older, older_link = self.connect()
        seen = []
        self.ownership.claim_answered(older).addCallback(
            lambda _: seen.append(older_link.closed[:])
        )
        self.connect()
        self.assertEqual(seen, [[]])
        self.assertEqual(older_link.closed, [(wire.CLOSE_REPLACED, "replaced")])

    def test_a_repeated_request_id_while_waiting_for_our_claim_runs_once(self):
        """(Only a faulty peer repeats an id: the last one stands, and nothing raises.)"""
        _, link = self.connect()
        self.relay.on_request(self.request("2"))
        self.relay.on_request(self.request("3"))
        self.redis.claims[0].callback([3, ""])
        self.assertEqual([sent["type"] for sent in link.sent], ["ping"])
        self.assertEqual(self.flushLoggedErrors(), [])

    def request(self, epoch):
        return {
            "t": "req",
            "id": "r1",
            "from": "there",
            "key": ["local", "7:"],
            "epoch": epoch,
            "type": "ping",
            "payload": {},
            "timeout": 5,
        }

    def test_a_relayed_request_runs_only_at_the_epoch_we_hold(self):
        _, link = self.connect()
        self.redis.claims[0].callback([3, ""])
        self.relay.on_request(self.request("2"))
        self.assertEqual(link.sent, [])
        [(to, answer)] = self.redis.published
        self.assertEqual((to, answer["t"], answer["code"]), ("there", "fail", errors.NOT_CONNECTED))
        self.relay.on_request(self.request("3"))
        [sent] = link.sent
        self.assertEqual((sent["event"], sent["type"]), ("gateway_request", "ping"))

    def test_a_request_before_our_claim_is_answered_waits_for_it(self):
        """
        Redis ran our claim and the other process sent a request at its epoch before
        we read Redis's answer (two connections): it runs once we have, at that epoch.
        """
        _, link = self.connect()
        self.relay.on_request(self.request("3"))
        self.assertEqual((link.sent, self.redis.published), ([], []))
        self.redis.claims[0].callback([3, ""])
        [sent] = link.sent
        self.assertEqual((sent["event"], sent["type"]), ("gateway_request", "ping"))

    def test_a_request_waiting_for_our_claim_at_another_epoch_is_refused(self):
        _, link = self.connect()
        self.relay.on_request(self.request("2"))
        self.redis.claims[0].callback([3, ""])
        self.assertEqual(link.sent, [])
        [(to, answer)] = self.redis.published
        self.assertEqual((to, answer["t"], answer["code"]), ("there", "fail", errors.NOT_CONNECTED))

    def test_a_request_waiting_for_a_failed_claim_is_refused(self):
        _, link = self.connect()
        self.relay.on_request(self.request("1"))
        self.redis.claims[0].errback(GatewayError(errors.UNAVAILABLE, "Redis is away"))
        self.assertEqual(link.sent, [])
        [(_, answer)] = self.redis.published
        self.assertEqual(answer["code"], errors.NOT_CONNECTED)

    def test_a_request_cancelled_while_waiting_for_our_claim_never_runs(self):
        _, link = self.connect()
        self.relay.on_request(self.request("3"))
        self.relay.on_cancel({"t": "cancel", "id": "r1", "from": "there"})
        self.redis.claims[0].callback([3, ""])
        self.assertEqual((link.sent, self.redis.published), ([], []))


class RelayedListenerTests(SynchronousTestCase):
    def test_a_listener_that_ends_a_relayed_request_ends_it_there_too(self):
        redis = FakeRedis()
        registry = Registry(Clock())
        clock = Clock()
        ownership = Ownership(registry, redis, "here", 15000, clock)
        relay = Relay(registry, redis, ownership, "here", clock)

        def too_large(payload):
            raise GatewayError(errors.TOO_LARGE, "a screen of 512x512")

        request = {"t": "req", "key": ("local", "7:"), "type": "screen_watch", "timeout": 60}
        d = relay._relay(("there", 2), request, too_large)
        ((_, sent),) = redis.published
        relay.on_partial({"t": "partial", "id": sent["id"], "payload": {"rows": {}}})
        self.assertEqual(self.failureResultOf(d, GatewayError).value.code, errors.TOO_LARGE)
        self.assertEqual(
            redis.published[-1], ("there", {"t": "cancel", "id": sent["id"], "from": "here"})
        )
