"""
Issue 44: an ask's state at every edge of its life, against the fake opencode of
``helpers``: the computer leaving, the gateway stopping, a reply opencode did not
take, and parallel calls of one tool.  Each of these failed on main 0dc4e52.
"""

import os

from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessTerminated
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from tests.unit.opencode.helpers import SES, AskTestsMixin, FakeResponse
from tests.unit.opencode.test_managed import Spawner
from trapsandbox import errors, limits
from trapsandbox.errors import GatewayError
from trapsandbox.opencode import managed as managed_module
from trapsandbox.opencode.asks import Asks
from trapsandbox.opencode.directories import directory_name
from trapsandbox.opencode.managed import Managed
from trapsandbox.opencode.managed import State as ManagedState
from trapsandbox.opencode.queue import AskQueue
from trapsandbox.opencode.run import State
from trapsandbox.opencode.servers import Server
from trapsandbox.opencode.tokens import AskTokens


class FakeRegistry:
    """What ``Asks.watch`` needs of the registry: ``watch`` and ``find``."""

    def __init__(self):
        self.sessions = {}
        self.watchers = []

    def watch(self, listener):
        self.watchers.append(listener)
        return lambda: self.watchers.remove(listener)

    def find(self, account_id, trapos_id):
        return self.sessions.get((account_id, trapos_id))

    def connect(self, key):
        self.sessions[key] = session = object()
        for listener in list(self.watchers):
            listener()
        return session

    def disconnect(self, key):
        del self.sessions[key]
        for listener in list(self.watchers):
            listener()


class DisconnectTests(AskTestsMixin, SynchronousTestCase):
    """A computer that disconnects ends its asks, wherever they came from."""

    def setUp(self):
        super().setUp()
        self.registry = FakeRegistry()
        self.asks.watch(self.registry)
        self.session = self.registry.connect(("local", "1:a"))

    def ask_on(self, session, **kwargs):
        emit = self.partials.append  # the console's: it never fails, the computer gone or not
        kwargs.setdefault("message_id", "m1")
        return Deferred.fromCoroutine(
            self.asks.ask(
                "local", "1:a", frozenset(), kwargs["message_id"], {"prompt": "hi"}, emit, session
            )
        )

    def test_a_disconnect_aborts_the_run_frees_its_slot_and_counts_it(self):
        done = self.ask_on(self.session)
        self.busy()
        self.registry.disconnect(("local", "1:a"))
        self.assertIn(f"/session/{SES}/abort", self.http.paths("POST"))
        error = self.failureResultOf(done, GatewayError).value
        self.assertEqual(error.code, errors.NOT_CONNECTED)
        self.assertEqual(self.outcome("disconnected"), 1)
        self.assertEqual(self.asks.runs, {})
        self.assertEqual(self.asks.queue.running_of["local"], 0)
        # Back again: its next ask starts at once, in the same conversation.
        again = self.registry.connect(("local", "1:a"))
        self.assertNoResult(self.ask_on(again, message_id="m2"))
        self.assertEqual(self.http.paths("POST").count(f"/session/{SES}/prompt_async"), 2)

    def test_a_disconnect_while_waiting_for_the_player_ends_it(self):
        done = self.ask_on(self.session)
        self.assistant()
        self.tool("running", input={"command": "ls"}, tool="trapsandbox_run_command")
        self.permission(tool="trapsandbox_run_command")
        self.registry.disconnect(("local", "1:a"))
        self.assertEqual(self.failureResultOf(done, GatewayError).value.code, errors.NOT_CONNECTED)
        self.assertIn(f"/session/{SES}/abort", self.http.paths("POST"))
        self.assertRaises(GatewayError, self.asks.reply, "local", "1:a", "per_1", "once")

    def test_a_replaced_connection_ends_the_old_connections_ask(self):
        done = self.ask_on(self.session)
        self.busy()
        self.registry.connect(("local", "1:a"))  # it connected again: a new session
        self.assertEqual(self.failureResultOf(done, GatewayError).value.code, errors.NOT_CONNECTED)

    def test_a_disconnect_while_queued_sends_nothing_to_opencode(self):
        self.asks_with(queue=AskQueue(self.clock, per_server=1))
        self.asks.watch(self.registry)
        other = self.registry.connect(("local", "2:b"))
        first = Deferred.fromCoroutine(
            self.asks.ask("local", "2:b", frozenset(), "m0", {"prompt": "x"}, lambda _: None, other)
        )
        done = self.ask_on(self.session)
        sessions = self.http.sessions
        self.registry.disconnect(("local", "1:a"))
        self.assertEqual(self.failureResultOf(done, GatewayError).value.code, errors.NOT_CONNECTED)
        self.assertEqual(self.asks.queue.waiting, [])
        self.assertEqual(self.http.sessions, sessions)
        self.assertNoResult(first)

    def test_other_computers_changing_leave_the_ask_alone(self):
        done = self.ask_on(self.session)
        self.registry.connect(("local", "2:b"))
        self.registry.disconnect(("local", "2:b"))
        self.assertNoResult(done)


class StopTests(AskTestsMixin, SynchronousTestCase):
    """The gateway's stop: nothing new reaches opencode; running asks are aborted there."""

    def setUp(self):
        super().setUp()
        self.asks_with(queue=AskQueue(self.clock, per_server=2))
        self.running = [self.ask(trapos=f"{n}:r", message_id=f"r{n}") for n in range(2)]
        self.queued = [self.ask(trapos=f"{n}:q", message_id=f"q{n}") for n in range(3)]
        for ses in ("ses_1", "ses_2"):
            self.busy(ses)

    def test_stop_aborts_the_running_and_starts_none_of_the_queued(self):
        sessions = self.http.sessions
        gets = len(self.http.stream_gets)
        stopped = self.asks.stop()
        self.assertEqual(self.http.sessions, sessions)  # no POST /session after the stop
        posts = self.http.paths("POST")
        self.assertIn("/session/ses_1/abort", posts)
        self.assertIn("/session/ses_2/abort", posts)
        for d in self.running + self.queued:
            error = self.failureResultOf(d, GatewayError).value
            self.assertEqual((error.code, error.message), (errors.NOT_CONNECTED, error.message))
            self.assertIn("shutting down", error.message)
        self.successResultOf(stopped)  # opencode had the aborts
        self.assertEqual(self.asks.runs, {})
        self.assertEqual(len(self.http.stream_gets), gets)
        self.assertEqual(self.clock.getDelayedCalls(), [])  # no timer is left

    def test_the_stop_waits_for_every_call_in_flight(self):
        # An abort opencode has not answered yet, and a call the stop did not start (the
        # gateway's pool is closed once it fires: an answer after that has nowhere to go).
        abort, status = Deferred(), Deferred()
        self.http.answers[("POST", "/session/*/abort")] = abort
        self.http.answers[("GET", "/session/status")] = status
        statuses = self.asks.servers[0].client.statuses("/d")
        stopped = self.asks.stop()
        self.assertNoResult(stopped)
        abort.callback(FakeResponse(200, b"true"))
        self.assertNoResult(stopped)
        status.callback(FakeResponse(200, b"{}"))
        self.successResultOf(stopped)
        self.assertEqual(self.successResultOf(statuses), {})
        for d in self.running + self.queued:
            self.failureResultOf(d, GatewayError)

    def test_a_call_opencode_never_answers_holds_the_stop_only_for_its_bound(self):
        self.http.answers[("POST", "/session/*/abort")] = Deferred()
        stopped = self.asks.stop()
        self.clock.advance(limits.ASK_CALL_TIMEOUT - 1)
        self.assertNoResult(stopped)
        self.clock.advance(1)
        self.successResultOf(stopped)
        for d in self.running + self.queued:
            self.failureResultOf(d, GatewayError)

    def test_after_the_stop_an_ask_is_refused_and_the_stream_stays_closed(self):
        self.asks.stop()
        for d in self.running + self.queued:
            self.failureResultOf(d, GatewayError)
        gets = len(self.http.stream_gets)
        d = self.ask(trapos="9:z", message_id="late")
        self.assertEqual(self.failureResultOf(d, GatewayError).value.code, errors.NOT_CONNECTED)
        self.failureResultOf(self.asks.stream.ready(), GatewayError)
        self.assertEqual(len(self.http.stream_gets), gets)
        self.clock.advance(limits.EVENT_RECONNECT_MAX * 10)
        self.assertEqual(len(self.http.stream_gets), gets)
        self.assertEqual(self.clock.getDelayedCalls(), [])


class ReplyTests(AskTestsMixin, SynchronousTestCase):
    """A reply is forgotten only once opencode has it: a failed one may be sent again."""

    def setUp(self):
        super().setUp()
        self.done = self.ask()
        self.assistant()

    def test_a_permission_reply_opencode_did_not_take_can_be_sent_again(self):
        self.tool("running", input={"command": "ls"}, tool="trapsandbox_run_command")
        self.permission(tool="trapsandbox_run_command")
        self.http.answers[("POST", "/permission/*/reply")] = (502, {"error": "bad gateway"})
        failed = self.failureResultOf(self.asks.reply("local", "1:a", "per_1", "once"))
        self.assertEqual(failed.value.code, errors.OPENCODE_ERROR)
        self.assertIn("answer again", failed.value.message)
        self.http.answers[("POST", "/permission/*/reply")] = True
        self.successResultOf(self.asks.reply("local", "1:a", "per_1", "once"))
        self.assertEqual(self.http.paths("POST").count("/permission/per_1/reply"), 2)
        # opencode has it now: forgotten.
        self.assertRaises(GatewayError, self.asks.reply, "local", "1:a", "per_1", "once")

    def test_a_question_answer_that_timed_out_can_be_sent_again(self):
        self.http.event(
            "question.asked",
            id="que_1",
            sessionID=SES,
            questions=[{"question": "Which?", "header": "H", "options": [{"label": "a"}]}],
        )
        self.http.answers[("POST", "/question/*/reply")] = Deferred()  # never answers
        pending = self.asks.answer("local", "1:a", "que_1", [["a"]], None)
        self.clock.advance(limits.ASK_CALL_TIMEOUT + 1)
        self.assertEqual(self.failureResultOf(pending).value.code, errors.OPENCODE_ERROR)
        self.http.answers[("POST", "/question/*/reply")] = True
        self.successResultOf(self.asks.answer("local", "1:a", "que_1", [["a"]], None))
        self.assertRaises(GatewayError, self.asks.answer, "local", "1:a", "que_1", [["a"]], None)


class ParallelToolTests(AskTestsMixin, SynchronousTestCase):
    def test_two_calls_of_one_tool_keep_their_call_ids(self):
        self.ask()
        self.assistant()
        self.tool("running", call="call_1", input={"path": "/a"}, tool="trapsandbox_read_file")
        self.tool("running", call="call_2", input={"path": "/b"}, tool="trapsandbox_read_file")
        self.tool("completed", call="call_2", input={"path": "/b"}, tool="trapsandbox_read_file")
        tools = [(p["callID"], p["status"]) for p in self.partials if p["type"] == "tool"]
        self.assertEqual(
            tools, [("call_1", "running"), ("call_2", "running"), ("call_2", "completed")]
        )


class MachineTests(AskTestsMixin, SynchronousTestCase):
    """The machine of ``opencode.run``: its states, and every ending releasing the same."""

    def run_of(self, trapos="1:a"):
        return self.asks.runs[("local", trapos)]

    def assertReleased(self):
        self.assertEqual(self.asks.runs, {})
        self.assertEqual(dict(self.asks.queue.running_on), {})
        self.assertEqual(dict(self.asks.queue.running_of), {})
        self.assertEqual(self.asks.queue.waiting, [])
        self.assertEqual(self.asks.replies._permissions, {})
        self.assertEqual(self.asks.replies._questions, {})
        self.assertEqual(self.asks.stream._listeners, {})
        # Only the instance's give-back timer and the stream's are left: none of the ask's.
        self.assertEqual(
            [
                call
                for call in self.clock.getDelayedCalls()
                if "Instances._idled" not in repr(call) and "EventStream" not in repr(call)
            ],
            [],
        )

    def test_the_states_of_an_ask(self):
        self.asks_with(queue=AskQueue(self.clock, per_server=1))
        done = self.ask()
        run = self.run_of()
        self.assertEqual(run.state, State.RUNNING)
        second = self.ask(trapos="2:b", message_id="m2")
        self.assertEqual(self.run_of("2:b").state, State.QUEUED)
        self.assistant()
        self.tool("running", input={"command": "ls"}, tool="trapsandbox_run_command")
        self.permission(tool="trapsandbox_run_command")
        self.assertEqual(run.state, State.WAITING)
        self.http.answers[("POST", "/permission/*/reply")] = (500, {})
        self.failureResultOf(self.asks.reply("local", "1:a", "per_1", "once"), GatewayError)
        self.assertEqual(run.state, State.WAITING)  # not taken: still waiting for the player
        self.http.answers[("POST", "/permission/*/reply")] = True
        self.successResultOf(self.asks.reply("local", "1:a", "per_1", "once"))
        self.assertEqual(run.state, State.RUNNING)
        self.idle()
        self.assertEqual(self.successResultOf(done)["sessionId"], SES)
        self.assertEqual(run.state, State.ENDED)
        # Its slot went to the next: admitted, its session opened, its prompt sent.
        self.assertEqual(self.run_of("2:b").state, State.RUNNING)
        self.asks.halt("local", "2:b", GatewayError(errors.STOPPED, "stopped"))
        self.failureResultOf(second, GatewayError)
        self.assertReleased()

    def waiting_for_the_player(self):
        done = self.ask()
        self.assistant()
        self.http.event(
            "question.asked",
            id="que_1",
            sessionID=SES,
            questions=[{"question": "Which?", "header": "H", "options": [{"label": "a"}]}],
        )
        self.delta("half a senten")
        self.assertEqual(self.run_of().state, State.WAITING)
        return done

    def delta(self, text):
        self.http.event(
            "message.part.delta", sessionID=SES, messageID="msg_a", partID="prt_1", delta=text
        )

    def test_every_ending_releases_the_same(self):
        registry = FakeRegistry()
        self.asks.watch(registry)
        endings = {
            "timeout": lambda: self.clock.advance(limits.ASK_TIMEOUT),
            "cancel": lambda: (
                self.asks.cancel("local", "1:a", "m1"),
                self.clock.advance(limits.ASK_ABORT_GRACE),
            ),
            "halt": lambda: self.asks.halt("local", "1:a", GatewayError(errors.STOPPED, "stopped")),
            "disconnect": lambda: registry.disconnect(("local", "1:a")),
            "server lost": lambda: self.asks._gone(
                self.asks.servers[0], GatewayError(errors.OPENCODE_ERROR, "gone")
            ),
            "idle": self.idle,
        }
        for name, ending in endings.items():
            with self.subTest(name):
                session = registry.connect(("local", "1:a"))
                self.partials.clear()
                done = self.waiting_for_the_player()
                self.run_of().session = session
                ending()
                self.assertReleased()
                # What the agent had said reached the player before the end.
                self.assertIn({"type": "text_delta", "text": "half a senten"}, self.partials)
                if name == "idle":
                    self.successResultOf(done)
                else:
                    self.failureResultOf(done, GatewayError)
                registry.sessions.clear()


class RecycleTests(AskTestsMixin, SynchronousTestCase):
    """An opencode the gateway runs (``managed``, a fake process) past its memory bound."""

    def setUp(self):
        super().setUp()
        self.spawn = Spawner()
        self.managed = Managed(
            self.clock, "opencode", "/bin/opencode", 4321, "pw", {}, spawn=self.spawn
        )
        self.rss = 100
        self.patch(managed_module, "rss_bytes", lambda pid: self.rss)
        self.asks = Asks(
            [Server.build(self.client, self.clock, self.root, AskTokens(), managed=self.managed)],
            self.clock,
            self.metrics,
            AskTokens(),
            AskQueue(self.clock),
            max_rss=1000,
        )
        self.managed.start()
        self.spawn.last.protocol.childDataReceived(1, b"opencode server listening on x\n")
        self.assertTrue(self.managed.taking_asks)

    def prompts(self):
        return [p for p in self.http.paths("POST") if p.endswith("/prompt_async")]

    def test_past_the_bound_while_asks_run_it_drains_within_a_check(self):
        # No ask starts or ends meanwhile: the memory is looked at on a timer too.
        first = self.ask(trapos="1:a")
        self.busy()
        self.clock.advance(limits.OPENCODE_RSS_CHECK_EVERY)
        self.assertIs(self.managed.state, ManagedState.READY)
        self.rss = 2000
        self.clock.advance(limits.OPENCODE_RSS_CHECK_EVERY)
        self.assertIs(self.managed.state, ManagedState.DRAINING)
        self.assertEqual(self.spawn.last.signals, [])  # the running ask is not cut
        self.idle()
        self.successResultOf(first)
        self.assertEqual(self.spawn.last.signals, ["TERM"])
        # Nothing runs there: its memory is no longer looked at.
        checks = [c for c in self.clock.getDelayedCalls() if "LoopingCall" in repr(c.func)]
        self.assertEqual(checks, [])

    def test_each_start_looks_at_the_model_before_it_takes_asks(self):
        # The start (setUp) looked: the first ask does not wait for a look of its own.
        self.assertEqual(self.http.paths("GET").count("/config/providers"), 1)
        first = self.ask(trapos="1:a")
        self.assertEqual(self.http.paths("GET").count("/config/providers"), 1)
        self.assertEqual(len(self.prompts()), 1)
        self.busy()
        self.idle()
        self.successResultOf(first)
        # It starts again, and the operator took its model away meanwhile: it is starting
        # until it has looked, and the ask that waited for it says so.
        looking = Deferred()
        self.http.answers[("GET", "/config/providers")] = looking
        self.spawn.last.protocol.processExited(Failure(ProcessTerminated(signal=9)))
        self.clock.advance(limits.OPENCODE_RESTART_MIN)
        self.spawn.last.protocol.childDataReceived(1, b"opencode server listening on x\n")
        self.assertIs(self.managed.state, ManagedState.STARTING)
        second = self.ask(trapos="2:b", message_id="m2")
        self.assertEqual(self.http.paths("GET").count("/config/providers"), 2)
        self.http.answers[("GET", "/config/providers")] = {"providers": [], "default": {}}
        looking.callback(FakeResponse(200, b'{"providers": [], "default": {}}'))
        self.assertIs(self.managed.state, ManagedState.READY)
        self.assertIn("the agent has no model", self.failureResultOf(second).value.message)
        self.assertEqual(len(self.prompts()), 1)

    def asked(self, trapos, session=SES, message_id="m1"):
        done = self.ask(trapos=trapos, message_id=message_id)
        self.busy(session)
        self.idle(session)
        self.successResultOf(done)

    def test_once_nobody_asked_for_a_while_a_large_one_is_started_afresh(self):
        self.asked("1:a")
        self.rss = 800  # past three quarters of its bound (1000), not past the bound
        self.clock.advance(limits.OPENCODE_QUIET_RECYCLE_AFTER - 1)
        self.asked("2:b", "ses_2", "m2")  # an ask meanwhile: the quiet starts again
        self.clock.advance(limits.OPENCODE_QUIET_RECYCLE_AFTER - 1)
        self.assertEqual(self.spawn.last.signals, [])
        self.clock.advance(1)
        self.assertEqual(self.spawn.last.signals, ["TERM"])
        self.spawn.last.protocol.processExited(Failure(ProcessTerminated(signal=15)))
        self.assertEqual(self.managed.restarts, {"recycled": 1})
        self.assertEqual(len(self.spawn.spawned), 2)  # started again at once

    def test_a_small_one_or_one_with_an_ask_running_is_left_alone(self):
        self.asked("1:a")
        self.rss = 700  # under three quarters of its bound
        self.clock.advance(limits.OPENCODE_QUIET_RECYCLE_AFTER)
        self.assertEqual(self.spawn.last.signals, [])
        self.rss = 800
        running = self.ask(trapos="2:b", message_id="m2")
        self.clock.advance(limits.OPENCODE_QUIET_RECYCLE_AFTER * 1.5)  # (within its own bound)
        self.assertEqual(self.spawn.last.signals, [])  # an ask runs: not quiet
        self.assertNoResult(running)

    def test_an_ask_ended_by_a_bug_still_starts_the_quiet(self):
        def bug(*args):
            raise RuntimeError("a bug")

        self.patch(self.asks, "_conversation", bug)
        self.failureResultOf(self.ask(trapos="1:a"), RuntimeError)  # raised as it is
        self.assertEqual(self.asks.runs, {})
        self.rss = 800
        self.clock.advance(limits.OPENCODE_QUIET_RECYCLE_AFTER)
        self.assertEqual(self.spawn.last.signals, ["TERM"])

    def test_the_stop_leaves_no_quiet_timer(self):
        self.asked("1:a")
        self.asks.stop()
        self.assertEqual(
            [c for c in self.clock.getDelayedCalls() if "_recycle_quiet" in repr(c.func)], []
        )

    def test_with_nothing_running_its_memory_is_not_looked_at(self):
        done = self.ask(trapos="1:a")
        self.busy()
        self.idle()
        self.successResultOf(done)
        self.rss = 2000
        self.clock.advance(limits.OPENCODE_RSS_CHECK_EVERY * 10)
        self.assertIs(self.managed.state, ManagedState.READY)

    def test_an_ask_starting_past_the_bound_waits_for_the_recycle_and_goes_on(self):
        first = self.ask(trapos="1:a")
        self.assertEqual(len(self.prompts()), 1)
        self.rss = 2000  # the first ask's instance carried it past the bound
        second = self.ask(trapos="2:b", message_id="m2")
        # It does not start there: the server drains, and the player is told.
        self.assertEqual(len(self.prompts()), 1)
        self.assertIs(self.managed.state, ManagedState.DRAINING)
        self.assertIn("your ask waits for it", self.partials[-1]["text"])
        self.assertEqual(self.spawn.last.signals, [])  # the running ask is not cut
        self.busy()
        self.idle()
        self.successResultOf(first)
        self.assertEqual(self.spawn.last.signals, ["TERM"])  # recycled once it ended
        self.spawn.last.protocol.processExited(Failure(ProcessTerminated(signal=15)))
        self.rss = 100
        self.spawn.last.protocol.childDataReceived(1, b"opencode server listening on x\n")
        self.assertEqual(len(self.prompts()), 2)  # the waiting ask went on
        self.assertNoResult(second)
        self.assertEqual(self.managed.restarts, {"recycled": 1})
        # The first ask's instance went with the old process: not given back (that would
        # make it anew in this one), and no longer counted.
        self.assertEqual(list(self.asks.servers[0].instances.live), [("local", "2:b")])
        self.busy("ses_2")
        self.idle("ses_2")
        self.successResultOf(second)
        self.clock.advance(limits.ASK_INSTANCE_IDLE)
        disposed = [c[2] for c in self.http.calls if c[1] == "/instance/dispose"]
        self.assertEqual(disposed, [[os.path.join(self.root, directory_name("local", "2:b"))]])
