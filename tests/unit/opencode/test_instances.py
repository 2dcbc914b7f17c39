"""
opencode instances given back (``opencode.instances``): after an idle time,
past a bound (the least recently used first, never one an ask uses), when a
conversation is forgotten; and an ask meeting a dispose in flight waits for it.
"""

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from tests.unit.opencode.helpers import SES, URL, AskTestsMixin
from trapsandbox.opencode.directories import directory_name
from trapsandbox.opencode.instances import Instances


class InstancesTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.disposed = []
        self.answer = None
        self.instances = Instances(self.clock, self.dispose, idle=60, bound=2)

    def dispose(self, key):
        self.disposed.append(key)
        return succeed(True) if self.answer is None else self.answer

    def asked(self, name):
        self.successResultOf(self.instances.use(("a", name)))
        self.instances.done(("a", name))

    def test_an_instance_unused_for_the_idle_time_is_given_back(self):
        self.asked("1")
        self.clock.advance(59)
        self.asked("1")  # used again: its clock starts over
        self.clock.advance(59)
        self.assertEqual(self.disposed, [])
        self.clock.advance(1)
        self.assertEqual(self.disposed, [("a", "1")])
        self.assertEqual(self.instances.live, {})
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_an_instance_in_use_is_never_given_back(self):
        self.successResultOf(self.instances.use(("a", "1")))
        self.clock.advance(3600)
        self.instances.give_back(("a", "1"))
        for name in "234":
            self.asked(name)
        self.assertNotIn(("a", "1"), self.disposed)
        self.instances.done(("a", "1"))
        self.clock.advance(60)
        self.assertIn(("a", "1"), self.disposed)

    def test_past_the_bound_the_least_recently_used_is_given_back(self):
        self.asked("1")
        self.asked("2")
        self.asked("1")  # now 2 is the least recently used
        self.asked("3")
        self.assertEqual(self.disposed, [("a", "2")])
        self.assertEqual(list(self.instances.live), [("a", "1"), ("a", "3")])
        self.clock.advance(60)  # the one given back left no timer behind
        self.assertEqual(sorted(self.disposed), [("a", "1"), ("a", "2"), ("a", "3")])

    def test_forgetting_gives_back_at_once(self):
        self.asked("1")
        self.instances.give_back(("a", "1"))
        self.instances.give_back(("a", "unknown"))
        self.assertEqual(self.disposed, [("a", "1")])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_an_ask_waits_for_a_dispose_in_flight(self):
        self.answer = Deferred()
        self.asked("1")
        self.clock.advance(60)
        using = self.instances.use(("a", "1"))
        self.assertNoResult(using)
        self.answer.callback(True)
        self.successResultOf(using)
        self.assertEqual(self.instances.disposing, {})

    def test_a_failed_dispose_is_only_logged(self):
        self.answer = Deferred()
        self.asked("1")
        self.clock.advance(60)
        using = self.instances.use(("a", "1"))
        self.answer.errback(RuntimeError("opencode went away"))
        self.successResultOf(using)
        self.assertEqual(len(self.flushLoggedErrors()), 0)
        self.assertEqual(self.instances.dispose_failures, 1)

    def test_instances_given_back_are_counted_by_reason(self):
        self.asked("1")
        self.clock.advance(60)  # idle
        self.asked("2")
        self.instances.give_back(("a", "2"))  # forgotten
        for name in "345":
            self.asked(name)  # 3 past the bound of 2
        self.assertEqual(dict(self.instances.given_back), {"idle": 1, "forgotten": 1, "bound": 1})
        self.assertEqual(self.instances.dispose_failures, 0)


class AskInstancesTests(AskTestsMixin, SynchronousTestCase):
    """``Asks`` gives its instances back through ``POST /instance/dispose``."""

    def setUp(self):
        super().setUp()
        self.asks_with(
            instance_idle=300,
            max_instances=1,
            max_conversations=1,
        )

    def finish(self, d, session=SES):
        self.busy(session)
        self.idle(session)
        self.successResultOf(d)

    def disposals(self):
        return [c[2][0] for c in self.http.calls if c[:2] == ("POST", "/instance/dispose")]

    def test_an_idle_instance_is_disposed_and_the_next_ask_keeps_its_session(self):
        self.finish(self.ask())
        self.clock.advance(299)
        self.assertEqual(self.disposals(), [])
        self.clock.advance(1)
        directory = f"{self.root}/{directory_name('local', '1:a')}"
        self.assertEqual(self.disposals(), [directory])
        self.finish(self.ask(message_id="m2"))
        self.assertEqual(self.http.sessions, 1)  # the same conversation, where opencode keeps it
        prompts = [c for c in self.http.calls if c[1] == f"/session/{SES}/prompt_async"]
        self.assertEqual([c[2][0] for c in prompts], [directory, directory])
        # The block is in the directory's opencode.json: not added to either instance.
        self.assertEqual(self.http.paths("POST").count("/mcp"), 0)

    def test_past_the_bound_the_other_computers_instance_is_disposed(self):
        self.finish(self.ask())
        d = self.ask(trapos="2:b", account="other")
        self.assertEqual(self.disposals(), [f"{self.root}/{directory_name('local', '1:a')}"])
        self.finish(d, "ses_2")

    def test_a_forgotten_conversation_gives_its_instance_back(self):
        self.asks.instances.bound = 5
        self.finish(self.ask())
        self.finish(self.ask(trapos="2:b"), "ses_2")  # one conversation per account: 1:a forgotten
        self.assertEqual(self.disposals(), [f"{self.root}/{directory_name('local', '1:a')}"])


class AskInstanceMetricsTests(AskTestsMixin, SynchronousTestCase):
    """``/metrics`` reads each server's live instances and disposals from ``Asks``."""

    def value(self, name, **labels):
        return self.metrics.registry.get_sample_value(name, labels)

    def test_live_instances_and_those_given_back_by_reason(self):
        self.asks_with(instance_idle=300, max_instances=5)
        server = URL  # no user:password in it
        self.assertEqual(self.value("trapsandbox_opencode_instances_live", server=server), 0)
        self.assertEqual(
            self.value(
                "trapsandbox_opencode_instances_given_back_total", server=server, reason="idle"
            ),
            0,
        )
        d = self.ask()
        self.busy()
        self.assertEqual(self.value("trapsandbox_opencode_instances_live", server=server), 1)
        self.idle()
        self.successResultOf(d)
        self.clock.advance(300)
        self.assertEqual(self.value("trapsandbox_opencode_instances_live", server=server), 0)
        self.assertEqual(
            self.value(
                "trapsandbox_opencode_instances_given_back_total", server=server, reason="idle"
            ),
            1,
        )
        self.assertEqual(
            self.value("trapsandbox_opencode_instance_dispose_failures_total", server=server), 0
        )
