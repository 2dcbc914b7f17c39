"""
The console's watches in cluster mode, on a fake Redis and a ``Clock``: the
other processes listed again while watched, and a relayed activity watch.
"""

from __future__ import annotations

from twisted.internet.defer import CancelledError, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from tests.harness.callers import asking
from tests.harness.fakes import FakeLink
from trapsandbox import errors, limits
from trapsandbox.cluster.presence import Presence
from trapsandbox.cluster.relay import Relay
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.session import Session, describe_session
from trapsandbox.errors import GatewayError
from trapsandbox.web.operator import _renumbered

INTERVAL = 0.5


class FakeRedis:
    """Up or down (``ok``); what is published is kept, and ``receivers`` hear it."""

    connected = subscribed = ok = True
    receivers = 1

    def __init__(self) -> None:
        self.published: list[tuple[str, dict]] = []

    def publish(self, instance, message):
        self.published.append((instance, message))
        return succeed(self.receivers)


def _entry(trapos_id: str, gateway: str = "there") -> dict:
    return {"traposId": trapos_id, "accountId": "local", "capabilities": [], "gateway": gateway}


class ElsewhereTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.redis = FakeRedis()
        registry = Registry(self.clock)
        self.presence = Presence(
            registry, self.redis, "here", describe_session, 1500, self.clock, INTERVAL
        )
        self.presence.instances = [{"id": "here"}, {"id": "there"}]
        self.told = 0

    def listener(self):
        self.told += 1

    def answer(self, *computers):
        """``there`` answers the last listing with ``computers``."""
        instance, message = self.redis.published[-1]
        self.assertEqual((instance, message["t"]), ("there", "list"))
        self.presence.on_listed(
            {"t": "listed", "id": message["id"], "from": "there", "computers": list(computers)}
        )

    def test_a_process_not_answering_in_time_is_listed_unreachable(self):
        d = self.presence.computers([])
        self.assertNoResult(d)
        self.clock.advance(limits.CLUSTER_LIST_TIMEOUT)
        self.assertEqual(
            self.successResultOf(d), {"computers": [], "unreachableGateways": ["there"]}
        )

    def test_nobody_watching_lists_nothing(self):
        self.clock.advance(10 * INTERVAL)
        self.assertEqual(self.redis.published, [])
        stop = self.presence.watch(self.listener)
        self.assertEqual(len(self.redis.published), 1)  # at once
        self.answer(_entry("1:"))
        stop()
        self.assertEqual(self.presence.elsewhere, {"computers": []})
        self.clock.advance(10 * INTERVAL)
        self.assertEqual(len(self.redis.published), 1)

    def test_a_change_elsewhere_is_told_once_within_the_interval(self):
        self.presence.watch(self.listener)
        self.answer(_entry("1:"))
        self.assertEqual((self.told, self.presence.elsewhere), (1, {"computers": [_entry("1:")]}))
        self.clock.advance(INTERVAL)
        self.answer(_entry("1:"))  # the same: nothing told
        self.assertEqual(self.told, 1)
        self.clock.advance(INTERVAL)
        self.answer(_entry("2:"), _entry("1:"))
        self.assertEqual(self.told, 2)
        self.assertEqual(self.presence.elsewhere, {"computers": [_entry("1:"), _entry("2:")]})
        self.assertEqual(len(self.redis.published), 3)

    def test_a_process_not_answering_keeps_its_computers_said_unreachable(self):
        self.presence.watch(self.listener)
        self.answer(_entry("1:"))
        self.clock.advance(INTERVAL)  # listed again: no answer this time
        self.clock.advance(limits.CLUSTER_LIST_TIMEOUT)
        kept = {"computers": [_entry("1:")], "unreachableGateways": ["there"]}
        self.assertEqual((self.told, self.presence.elsewhere), (2, kept))
        # Moved meanwhile to a process that answers: listed there only.
        self.presence.instances.append({"id": "third"})
        self.clock.advance(INTERVAL)
        (to_third,) = [m for i, m in self.redis.published[-2:] if i == "third"]
        self.presence.on_listed(
            {
                "t": "listed",
                "id": to_third["id"],
                "from": "third",
                "computers": [_entry("1:", "third")],
            }
        )
        self.clock.advance(limits.CLUSTER_LIST_TIMEOUT)
        moved = {"computers": [_entry("1:", "third")], "unreachableGateways": ["there"]}
        self.assertEqual(self.presence.elsewhere, moved)
        self.presence.instances.pop()
        # Answering again, it is reachable again.
        self.clock.advance(INTERVAL)
        self.answer(_entry("1:"))
        self.assertEqual(self.presence.elsewhere, {"computers": [_entry("1:")]})

    def test_a_failure_while_relisting_does_not_end_the_listing(self):
        self.presence.watch(self.listener)
        self.answer({"traposId": "1:", "accountId": "local"})  # no gateway: _unknown fails
        self.redis.ok = False
        self.clock.advance(INTERVAL)
        self.assertEqual(len(self.flushLoggedErrors(KeyError)), 1)
        self.redis.ok = True
        self.clock.advance(INTERVAL)
        self.assertEqual(len(self.redis.published), 2)  # listed again all the same
        self.answer(_entry("2:"))
        self.assertEqual(self.presence.elsewhere, {"computers": [_entry("2:")]})

    def test_redis_down_keeps_the_watch_and_says_nothing_false(self):
        stop = self.presence.watch(self.listener)
        self.answer(_entry("1:"))
        self.redis.ok = False
        self.clock.advance(INTERVAL)
        kept = {"computers": [_entry("1:")], "unreachableGateways": ["there"]}
        self.assertEqual(self.presence.elsewhere, kept)
        self.clock.advance(10 * INTERVAL)  # still listed again each interval, nothing published
        self.assertEqual((len(self.redis.published), self.told), (1, 2))
        self.redis.ok = True
        self.clock.advance(INTERVAL)
        self.answer()  # gone meanwhile
        self.assertEqual((self.presence.elsewhere, self.told), ({"computers": []}, 3))
        stop()


class FollowActivityTests(SynchronousTestCase):
    """``Registry.follow_activity``: what the holder runs for another process's watch."""

    def setUp(self):
        self.clock = Clock()
        self.registry = Registry(self.clock)
        self.session = Session("local", "7:", FakeLink(), self.clock)
        self.registry.add(self.session)
        self.entries = []

    def test_not_here_fails_at_once(self):
        d = self.registry.follow_activity(asking("7:", "other"), self.entries.append)
        self.failureResultOf(d, GatewayError)

    def test_it_ends_when_the_computer_leaves_and_stops_when_cancelled(self):
        d = self.registry.follow_activity(asking("7:", "local"), self.entries.append)
        ping = self.registry.request(asking("7:"), "ping", timeout=1)
        self.assertEqual([e["state"] for e in self.entries], ["started"])
        self.registry.remove(self.session)
        failure = self.failureResultOf(d, GatewayError)
        self.assertEqual(failure.value.code, errors.NOT_CONNECTED)
        self.failureResultOf(ping, GatewayError)
        self.assertEqual((self.registry.activity._listeners, self.registry._watchers), ({}, []))

        self.registry.add(self.session)
        d = self.registry.follow_activity(asking("7:", "local"), self.entries.append)
        d.cancel()
        self.failureResultOf(d, CancelledError)
        self.assertEqual((self.registry.activity._listeners, self.registry._watchers), ({}, []))


class RenumberedTests(SynchronousTestCase):
    def test_another_process_entries_take_this_process_numbers(self):
        registry = Registry(Clock())
        told = []
        tell = _renumbered(registry, told.append)
        registry.activity.number()  # one entry of this process's own
        tell({"n": 1, "state": "started"})
        tell({"n": 1, "state": "running", "text": "x"})
        tell({"n": 2, "state": "started"})
        tell({"n": 1, "state": "ok"})
        tell({"n": 1, "state": "started"})  # (its process restarted its count)
        self.assertEqual(
            [(e["n"], e["state"]) for e in told],
            [(2, "started"), (2, "running"), (3, "started"), (2, "ok"), (4, "started")],
        )


class FixedEpoch:
    """Ownership holding every computer here at epoch 1."""

    def epoch_of(self, session):
        return 1


class ServedTests(SynchronousTestCase):
    """The holder's side of a relayed request or watch (``Relay.on_request``)."""

    def setUp(self):
        self.clock = Clock()
        self.redis = FakeRedis()
        self.registry = Registry(self.clock)
        self.session = Session("local", "7:", FakeLink(), self.clock)
        self.registry.add(self.session)
        self.relay = Relay(self.registry, self.redis, FixedEpoch(), "here", self.clock)
        self.entries = []

    def serve(self, relay_id, type="ping", **fields):
        message = {"t": "req", "id": relay_id, "from": "there", "key": ["local", "7:"]}
        message.update({"epoch": 1, "type": type, "payload": {}, "timeout": 5, **fields})
        self.relay.on_request(message)

    def test_a_relayed_request_is_in_the_activity_as_its_sender_sent_it(self):
        self.registry.activity.watch(asking("7:", "local"), self.entries.append)
        self.serve("r1", by={"by": "operator", "account": "alice"}, quiet=False)
        self.serve("r2", by={"by": "agent"}, quiet=True)  # one of a snapshot's reads
        self.serve("r3", by="nonsense")
        self.assertEqual(
            [(e["by"], e.get("account")) for e in self.entries],
            [("operator", "alice"), ("gateway", None)],
        )

    def test_a_relayed_watch_streams_entries_until_the_computer_leaves(self):
        self.serve(
            "w", type="watch_activity", watch="activity", timeout=limits.SCREEN_WATCH_TIMEOUT
        )
        self.registry.request(asking("7:"), "ping", timeout=1).addErrback(lambda _: None)
        (part,) = [m for _, m in self.redis.published if m["t"] == "partial"]
        self.assertEqual((part["id"], part["payload"]["state"]), ("w", "started"))
        self.registry.remove(self.session)
        _, end = self.redis.published[-1]
        self.assertEqual((end["t"], end["id"], end["code"]), ("fail", "w", "not_connected"))
        self.assertEqual((self.registry.activity._listeners, self.registry._watchers), ({}, []))

    def test_a_relayed_watch_stops_when_its_requester_cancels_or_at_its_bound(self):
        self.serve(
            "w", type="watch_activity", watch="activity", timeout=limits.SCREEN_WATCH_TIMEOUT
        )
        self.relay.on_cancel({"t": "cancel", "id": "w", "from": "there"})
        self.assertEqual((self.registry.activity._listeners, self.registry._watchers), ({}, []))
        self.serve("w2", type="watch_activity", watch="activity", timeout=10)
        self.clock.advance(10)
        self.assertEqual((self.registry.activity._listeners, self.registry._watchers), ({}, []))
        self.assertEqual([m["t"] for _, m in self.redis.published], [])
