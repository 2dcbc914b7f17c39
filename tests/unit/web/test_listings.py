"""Listings: watch_computers' listings built once per scope per change (issue 35)."""

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from trapsandbox import limits
from trapsandbox.web.listings import Listings


class FakeSource:
    """A registry's ``watch``: listeners told of a change on ``change()``."""

    def __init__(self):
        self.listeners = []

    def watch(self, listener):
        self.listeners.append(listener)
        return lambda: self.listeners.remove(listener)

    def change(self):
        for listener in list(self.listeners):
            listener()


class ListingsTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.source = FakeSource()
        # scope -> its computers, as the build lists them
        self.computers = {"alice": [{"traposId": "1:", "inFlight": 0}], "bob": []}
        self.built = []
        self.listings = Listings(self.build, [self.source.watch], self.clock)

    def build(self, scope):
        self.built.append(scope)
        return {"computers": [dict(c) for c in self.computers.get(scope, [])]}

    def watch(self, scope):
        heard = []
        stop = self.listings.watch(scope, heard.append)
        return heard, stop

    def test_a_watcher_hears_the_listing_at_once(self):
        heard, _ = self.watch("alice")
        self.assertEqual(
            [h.body for h in heard], [{"computers": [{"traposId": "1:", "inFlight": 0}]}]
        )

    def test_a_burst_of_changes_is_listed_once_per_scope_after_the_debounce(self):
        alices = [self.watch("alice")[0] for _ in range(5)]
        bobs = [self.watch("bob")[0] for _ in range(2)]
        self.built.clear()
        self.computers["alice"].append({"traposId": "2:", "inFlight": 0})
        for _ in range(100):
            self.source.change()
        self.assertEqual(self.built, [])
        self.clock.advance(limits.LISTING_DEBOUNCE)
        self.assertEqual(sorted(self.built), ["alice", "bob"])
        # Alice's watchers share one listing (encoded once); Bob's saw nothing change.
        latest = {id(heard[-1]) for heard in alices}
        self.assertEqual(len(latest), 1)
        self.assertEqual([len(heard) for heard in alices], [2] * 5)
        self.assertEqual([len(heard) for heard in bobs], [1, 1])
        self.assertEqual(alices[0][-1].encoded, alices[1][-1].encoded)
        self.assertIs(alices[0][-1].encoded, alices[1][-1].encoded)

    def test_the_work_of_a_change_does_not_grow_with_one_account_s_watchers(self):
        def builds_per_change(watchers):
            listings = Listings(self.build, [self.source.watch], self.clock)
            stops = [listings.watch("alice", lambda listing: None) for _ in range(watchers)]
            before = listings.builds
            self.source.change()
            self.clock.advance(limits.LISTING_DEBOUNCE)
            for stop in stops:
                stop()
            return listings.builds - before

        self.assertEqual(builds_per_change(1), builds_per_change(4096))
        self.assertEqual(builds_per_change(4096), 1)

    def test_only_in_flight_changing_sends_nothing(self):
        heard, _ = self.watch("alice")
        self.computers["alice"][0]["inFlight"] = 3
        self.source.change()
        self.clock.advance(limits.LISTING_DEBOUNCE)
        self.assertEqual(len(heard), 1)

    def test_the_sources_are_heard_only_while_someone_watches(self):
        self.assertEqual(self.source.listeners, [])
        _, stop_one = self.watch("alice")
        _, stop_two = self.watch("bob")
        self.assertEqual(len(self.source.listeners), 1)
        self.source.change()
        stop_one()
        stop_one()  # twice is once
        self.assertEqual(len(self.source.listeners), 1)
        stop_two()
        self.assertEqual(self.source.listeners, [])
        self.assertEqual(self.clock.getDelayedCalls(), [])  # the burst's listing is not made

    def test_a_watcher_joining_during_a_burst_hears_it_ending(self):
        first, _ = self.watch("alice")
        self.computers["alice"].append({"traposId": "2:", "inFlight": 0})
        self.source.change()
        second, _ = self.watch("alice")
        self.assertEqual(len(second[0].body["computers"]), 2)  # built for it, as it is now
        self.clock.advance(limits.LISTING_DEBOUNCE)
        self.assertEqual(len(first[-1].body["computers"]), 2)
        self.assertIs(first[-1], second[-1])

    def test_a_failing_watcher_does_not_keep_the_others_from_hearing(self):
        def broken(listing):
            raise RuntimeError("boom")

        self.listings.watch("alice", broken)
        heard, _ = self.watch("alice")
        self.computers["alice"].append({"traposId": "2:", "inFlight": 0})
        self.source.change()
        self.clock.advance(limits.LISTING_DEBOUNCE)
        self.assertEqual(len(heard), 2)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 2)  # its first, and this
