"""
Relays that lose their way (issue 43), on a ``Clock`` and a fake Redis under the
real ``Redis`` wrapper: Redis lost while requests are relayed, a holder that is
gone, and the cluster writing its ownerships again after Redis came back.
"""

from __future__ import annotations

import orjson
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from tests.harness.callers import asking
from tests.harness.fakes import FakeLink
from trapsandbox import errors, limits
from trapsandbox.cluster import member as cluster
from trapsandbox.cluster.ownership import CLAIM, _owner_key, computer_key
from trapsandbox.cluster.presence import HEARTBEAT
from trapsandbox.cluster.redis import inbox_of
from trapsandbox.computers import wire
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.session import Session, describe_session
from trapsandbox.errors import GatewayError

REFRESH = 0.5
OWNER = _owner_key(computer_key("local", "1:far"))


class FakeHandler:
    """txredisapi's connection as ``Redis.call`` uses it: keys, pub/sub, scripts."""

    def __init__(self) -> None:
        self.keys: dict[str, str] = {}
        self.published: list[tuple[str, dict]] = []
        self.subscribers = {inbox_of("a"): 1, inbox_of("b"): 1}
        self.beats = ["a", "b"]
        # Set: NUMSUB answers with it (a Deferred that may never fire).
        self.numsub: Deferred | None = None
        self.numsubs = 0

    def get(self, key):
        return succeed(self.keys.get(key))

    def publish(self, channel, data):
        self.published.append((channel, orjson.loads(data)))
        return succeed(self.subscribers.get(channel, 0))

    def eval(self, script, keys, args):
        if script == CLAIM:
            return succeed([1, ""])
        if script == HEARTBEAT:
            return succeed([orjson.dumps({"id": i}).decode() for i in self.beats])
        return succeed([1] * (len(keys) // 2))

    def execute_command(self, *args):
        assert args[:2] == ("PUBSUB", "NUMSUB"), args
        self.numsubs += 1
        if self.numsub is not None:
            return self.numsub
        reply = []
        for channel in args[2:]:
            reply += [channel, self.subscribers.get(channel, 0)]
        return succeed(reply)


class FakeCommands:
    """The commands factory: ``size`` 0 while Redis is away."""

    def __init__(self) -> None:
        self.handler = FakeHandler()
        self.size = 1


class Harness(SynchronousTestCase):
    """Process ``b`` of a cluster; ``1:far`` is held by ``a``."""

    def setUp(self):
        self.clock = Clock()
        self.registry = Registry(self.clock)
        self.member = cluster.Cluster(
            self.registry,
            "redis://127.0.0.1:1/0",
            self.clock,
            describe_session,
            refresh_interval=REFRESH,
            instance_id="b",
        )
        self.registry.peers = self.member
        self.commands = FakeCommands()
        self.redis = self.commands.handler
        self.member.redis._commands = self.commands
        self.member.redis.subscribed = True
        self.redis.keys[OWNER] = "a|3"

    def relayed(self, n: int = 1, type: str = "eval") -> list[Deferred]:
        ds = [
            self.registry.request(asking("1:far"), type, {"code": "sleep(60)"}, timeout=600)
            for _ in range(n)
        ]
        return ds

    def error(self, d: Deferred) -> GatewayError:
        return self.failureResultOf(d, GatewayError).value

    def sent(self, kind: str, to: str = "a") -> list[dict]:
        return [m for c, m in self.redis.published if c == inbox_of(to) and m["t"] == kind]

    def redis_dies(self) -> None:
        self.commands.size = 0
        self.member.redis._inbox_lost()  # the subscriber's connectionLost

    def redis_returns_empty(self) -> None:
        self.redis.keys.clear()
        self.commands.size = 1
        self.member.redis._subscribed(None)


class RedisLostTests(Harness):
    def test_relays_in_flight_are_answered_503_when_our_inbox_is_lost(self):
        ds = self.relayed(3)
        requests = self.sent("req")
        self.assertEqual(len(requests), 3)
        for d in ds:
            self.assertNoResult(d)
        self.redis_dies()
        # At once (the clock never moves in this test): not at the request's 600 s.
        for d in ds:
            self.assertEqual(self.error(d).status, 503)
        # The holder's late answer finds nobody waiting, and changes nothing.
        self.member._inbox_message(
            orjson.dumps({"t": "res", "id": requests[0]["id"], "ok": True, "payload": {}})
        )
        self.assertEqual(self.member.relay._relays, {})
        # Back: the holder is told to cancel each one (it could not be told meanwhile).
        self.redis_returns_empty()
        self.assertEqual(
            sorted(m["id"] for m in self.sent("cancel")), sorted(m["id"] for m in requests)
        )

    def test_the_cancels_go_once_commands_go_through_again(self):
        """The inbox can come back before the commands connection does."""
        ds = self.relayed(2)
        self.redis_dies()
        for d in ds:
            self.assertEqual(self.error(d).code, errors.UNAVAILABLE)
        self.member.redis._subscribed(None)
        self.assertEqual(self.sent("cancel"), [])
        self.commands.size = 1
        self.member.heartbeat()
        self.assertEqual(len(self.sent("cancel")), 2)
        self.member.heartbeat()
        self.assertEqual(len(self.sent("cancel")), 2)  # once

    def test_a_check_finding_redis_away_answers_them(self):
        """Lost without the inbox noticing (the commands connection went first)."""
        (d,) = self.relayed()
        self.commands.size = 0
        self.clock.advance(limits.CLUSTER_RELAY_CHECK_INTERVAL)
        self.assertEqual(self.error(d).code, errors.UNAVAILABLE)

    def test_redis_not_answering_the_check_answers_them(self):
        self.redis.numsub = fail(GatewayError(errors.UNAVAILABLE, "Redis did not answer"))
        (d,) = self.relayed()
        self.clock.advance(limits.CLUSTER_RELAY_CHECK_INTERVAL)
        self.assertIn("Redis did not answer", self.error(d).message)

    def test_a_check_that_redis_does_not_answer_ends_within_its_bound(self):
        self.redis.numsub = Deferred()  # never answers: Redis.call's own bound ends it
        (d,) = self.relayed()
        self.clock.advance(limits.CLUSTER_RELAY_CHECK_INTERVAL)
        self.assertNoResult(d)
        self.clock.advance(limits.CLUSTER_CALL_TIMEOUT)
        self.assertEqual(self.error(d).code, errors.UNAVAILABLE)


class HolderGoneTests(Harness):
    def test_a_holder_that_stops_listening_is_found_within_a_check(self):
        (d,) = self.relayed()
        self.clock.advance(limits.CLUSTER_RELAY_CHECK_INTERVAL)
        self.assertNoResult(d)  # still listening: left alone
        del self.redis.subscribers[inbox_of("a")]  # a is killed
        self.clock.advance(limits.CLUSTER_RELAY_CHECK_INTERVAL)
        self.assertIn("(a) is gone", self.error(d).message)
        self.assertEqual(self.sent("cancel")[0]["id"], self.sent("req")[0]["id"])

    def test_the_check_runs_only_while_relays_are_out(self):
        (d,) = self.relayed()
        (request,) = self.sent("req")
        self.member._inbox_message(
            orjson.dumps({"t": "res", "id": request["id"], "ok": True, "payload": {"x": 1}})
        )
        self.assertTrue(self.successResultOf(d).ok)
        self.clock.advance(limits.CLUSTER_RELAY_CHECK_INTERVAL)  # finds none: stops
        self.clock.advance(10 * limits.CLUSTER_RELAY_CHECK_INTERVAL)
        self.assertEqual(self.redis.numsubs, 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_holder_whose_heartbeat_expired_is_given_up_after_its_ttl(self):
        """A process that hangs stays subscribed; its heartbeat expires."""
        (d,) = self.relayed()
        ttl = self.member.heartbeat_interval * limits.CLUSTER_HEARTBEAT_TTL_FACTOR
        self.redis.beats = ["b"]
        self.member.heartbeat()
        self.assertNoResult(d)  # one listing without it: maybe not written again yet
        self.clock.advance(ttl)
        later = self.relayed()[0]  # sent after the listing started: not ended by it
        self.member.heartbeat()
        self.assertIn("heartbeat expired", self.error(d).message)
        self.assertNoResult(later)

    def test_a_holder_listed_again_is_kept(self):
        (d,) = self.relayed()
        self.redis.beats = ["b"]
        self.member.heartbeat()
        self.clock.advance(1)
        self.redis.beats = ["a", "b"]
        self.member.heartbeat()
        self.clock.advance(10)
        self.redis.beats = ["b"]
        self.member.heartbeat()
        self.assertNoResult(d)


class ServedTests(Harness):
    """The holder's side: ``b`` holds ``7:here`` and serves ``a``'s request for it."""

    def test_losing_redis_cancels_what_we_serve_and_drops_its_late_answer(self):
        link = FakeLink()
        session = Session("local", "7:here", link, self.clock, capabilities=frozenset({"eval"}))
        self.registry.add(session)
        epoch = self.member.ownership.epoch_of(session)
        self.assertIsNotNone(epoch)
        self.member._inbox_message(
            orjson.dumps(
                {
                    "t": "req",
                    "id": "r1",
                    "from": "a",
                    "key": ["local", "7:here"],
                    "epoch": epoch,
                    "type": "eval",
                    "payload": {"code": "sleep(60)"},
                    "timeout": 600,
                }
            )
        )
        (sent,) = link.sent
        self.assertEqual(sent["type"], "eval")
        self.redis_dies()
        cancel = link.sent[-1]
        self.assertEqual(
            (cancel["type"], cancel["payload"]), ("cancel", {"messageId": sent["messageId"]})
        )
        self.assertEqual(session.in_flight, 1)  # only the cancel itself
        # The computer's answer, late: no request of ours; nothing sent anywhere.
        frame = wire.ComputerResponse("7:here", sent["messageId"], "eval", True, {}, None)
        self.assertFalse(session.resolve(frame))
        self.assertEqual(self.sent("res"), [])
        self.assertEqual(self.sent("fail"), [])


class RebuildTests(Harness):
    """After Redis came back empty, until ``a`` has written ``1:far``'s ownership again."""

    def test_a_connected_computer_is_not_answered_404_while_the_cluster_rebuilds(self):
        self.redis_dies()
        (d,) = self.relayed()
        self.assertEqual(self.error(d).code, errors.UNAVAILABLE)  # away: 503, not 404
        self.redis_returns_empty()
        (d,) = self.relayed()
        self.clock.advance(limits.CLUSTER_REBUILD_POLL)
        self.clock.advance(limits.CLUSTER_REBUILD_POLL)
        self.assertNoResult(d)  # nobody holds it yet: looked up again, not 404
        self.redis.keys[OWNER] = "a|3"  # a's refresh
        self.clock.advance(limits.CLUSTER_REBUILD_POLL)
        (request,) = self.sent("req")
        self.assertEqual(request["epoch"], "3")
        self.assertNoResult(d)  # relayed, waiting for a's answer

    def test_a_computer_nobody_holds_is_404_once_the_rebuild_is_over(self):
        self.redis_dies()
        self.redis_returns_empty()
        (d,) = self.relayed()
        self.clock.pump([limits.CLUSTER_REBUILD_POLL] * 100)
        self.assertEqual(self.error(d).code, errors.NOT_CONNECTED)
        # Past the window: 404 at once.
        (d,) = self.relayed()
        self.assertEqual(self.error(d).code, errors.NOT_CONNECTED)

    def test_the_rebuild_ends_when_its_window_does(self):
        self.redis_dies()
        self.redis_returns_empty()
        (d,) = self.relayed()
        window = self.member.rebuild_window
        self.clock.advance(window - limits.CLUSTER_REBUILD_POLL)
        self.assertNoResult(d)
        self.clock.advance(limits.CLUSTER_REBUILD_POLL)
        self.assertEqual(self.error(d).code, errors.NOT_CONNECTED)

    def test_a_request_that_cannot_wait_for_the_rebuild_is_answered_503(self):
        self.redis_dies()
        self.redis_returns_empty()
        d = self.registry.request(asking("1:far"), "ping", {}, timeout=1)
        self.clock.advance(1)
        self.assertEqual(self.failureResultOf(d, GatewayError).value.code, errors.UNAVAILABLE)

    def test_the_first_subscription_is_no_rebuild(self):
        self.member.redis._subscribed(None)
        del self.redis.keys[OWNER]
        (d,) = self.relayed()
        self.assertEqual(self.error(d).code, errors.NOT_CONNECTED)

    def test_whether_it_is_connected_waits_too(self):
        self.redis_dies()
        self.redis_returns_empty()
        d = self.registry.connected("local", "1:far")
        self.clock.advance(limits.CLUSTER_REBUILD_POLL)
        self.assertNoResult(d)
        self.redis.keys[OWNER] = "a|3"
        self.clock.advance(limits.CLUSTER_REBUILD_POLL)
        self.assertTrue(self.successResultOf(d))
