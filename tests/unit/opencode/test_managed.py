"""
The opencode servers the gateway runs (issue 45, ``trapsandbox.opencode.managed``), with a
fake process and a ``Clock``: the restart delays, the stop's SIGTERM then SIGKILL, what it
says while it cannot answer, its output bounded in the log.
"""

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ProcessDone, ProcessExitedAlready, ProcessTerminated
from twisted.internet.task import Clock
from twisted.logger import formatEvent
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from tests.harness.logcapture import LogCapture
from trapsandbox import limits
from trapsandbox.opencode.client import opencode_error
from trapsandbox.opencode.managed import LINES_PER_INTERVAL, Managed, State


class Process:
    def __init__(self, protocol, pid):
        self.protocol = protocol
        self.pid = pid
        self.signals = []

    def signalProcess(self, name):
        self.signals.append(name)


class Spawner:
    def __init__(self):
        self.spawned = []

    def __call__(self, protocol, executable, argv, env):
        process = Process(protocol, 1000 + len(self.spawned))
        self.spawned.append((process, argv, env))
        return process

    @property
    def last(self):
        return self.spawned[-1][0]


def killed(signal=9):
    return Failure(ProcessTerminated(signal=signal))


class ManagedTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.spawn = Spawner()
        self.managed = Managed(
            self.clock,
            "opencode",
            "/bin/opencode",
            4321,
            "the-password",
            {"PATH": "/bin", "OPENCODE_SERVER_USERNAME": "someone"},
            spawn=self.spawn,
        )
        self.managed.answering = lambda: succeed(None)

    def ready(self):
        self.spawn.last.protocol.childDataReceived(1, b"opencode server listening on x\n")

    def test_it_starts_opencode_serve_on_its_port_with_its_password(self):
        self.managed.start()
        process, argv, env = self.spawn.spawned[0]
        self.assertEqual(
            argv[-6:], ["/bin/opencode", "serve", "--hostname", "127.0.0.1", "--port", "4321"]
        )
        self.assertEqual(env["OPENCODE_SERVER_PASSWORD"], "the-password")
        self.assertEqual(env["MIMALLOC_PURGE_DELAY"], "0")
        self.assertNotIn("OPENCODE_SERVER_USERNAME", env)  # the client uses opencode's default
        self.assertEqual(env["PATH"], "/bin")
        self.assertEqual(self.managed.unready(), "the agent is starting")
        self.ready()
        self.assertIs(self.managed.state, State.READY)
        self.assertIsNone(self.managed.unready())

    def test_one_that_keeps_dying_waits_longer_each_time_up_to_the_bound(self):
        self.managed.start()
        delays = []
        for _ in range(8):
            self.spawn.last.protocol.childDataReceived(2, b"Error: no such model\n")
            self.spawn.last.protocol.processExited(Failure(ProcessTerminated(exitCode=1)))
            self.assertIs(self.managed.state, State.RESTARTING)
            self.assertEqual(
                self.managed.unready(),
                "the agent is restarting (it exited with code 1: Error: no such model)",
            )
            [call] = self.clock.getDelayedCalls()
            delays.append(call.getTime() - self.clock.seconds())
            self.clock.advance(delays[-1])
        self.assertEqual(delays, [1, 2, 4, 8, 16, 30, 30, 30])
        self.assertEqual(self.managed.restarts, {"exited": 8})
        self.assertEqual(len(self.spawn.spawned), 9)

    def test_one_that_stayed_up_comes_back_after_the_shortest_delay(self):
        self.managed.start()
        for _ in range(3):
            self.spawn.last.protocol.processExited(killed())
            self.clock.advance(30)
        self.ready()
        self.clock.advance(limits.OPENCODE_STABLE_AFTER)
        self.spawn.last.protocol.processExited(killed())
        [call] = self.clock.getDelayedCalls()
        self.assertEqual(call.getTime() - self.clock.seconds(), 1)
        self.assertEqual(self.managed.restarts, {"killed": 4})

    def test_stop_sends_term_then_kill_after_the_grace_and_fires_when_it_ended(self):
        self.managed.start()
        self.ready()
        process = self.spawn.last
        logged = LogCapture(self)
        stopped = self.managed.stop()
        self.assertEqual(process.signals, ["TERM"])
        self.assertNoResult(stopped)
        self.clock.advance(limits.OPENCODE_STOP_GRACE)
        self.assertEqual(process.signals, ["TERM", "KILL"])
        process.protocol.processExited(killed())
        self.successResultOf(stopped)
        # How long it sat on SIGTERM is logged: a recycle's drain is that much longer.
        self.assertIn(
            f"opencode: stopped {limits.OPENCODE_STOP_GRACE:.1f} s after SIGTERM (it was killed by "
            "SIGKILL)",
            "\n".join(logged.texts()),
        )
        self.assertIs(self.managed.state, State.STOPPED)
        self.assertEqual(self.clock.getDelayedCalls(), [])  # not started again
        self.assertEqual(self.managed.restarts, {})

    def test_a_stop_while_it_waits_to_restart_cancels_the_restart(self):
        self.managed.start()
        self.spawn.last.protocol.processExited(Failure(ProcessDone(0)))
        self.successResultOf(self.managed.stop())
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(len(self.spawn.spawned), 1)

    def test_a_missing_program_is_never_spawned(self):
        managed = Managed(self.clock, "opencode", None, 4321, "pw", {}, spawn=self.spawn)
        managed.why = "'oc' was not found on PATH"
        logged = LogCapture(self)
        managed.start()
        self.assertEqual(self.spawn.spawned, [])
        self.assertEqual(managed.unready(), "opencode will not start: 'oc' was not found on PATH")
        self.assertIn("'oc' was not found on PATH", "\n".join(logged.texts()))
        self.successResultOf(managed.stop())
        self.assertIs(managed.state, State.FAILED)

    def test_its_output_is_logged_prefixed_cut_and_bounded(self):
        self.managed.start()
        logged = LogCapture(self)
        self.spawn.last.protocol.childDataReceived(1, b"x" * 1000 + b"\n")
        for n in range(200):
            self.spawn.last.protocol.childDataReceived(2, b"line %d\r\n" % n)
        self.clock.advance(limits.LOG_INTERVAL)
        self.spawn.last.protocol.childDataReceived(2, b"after\n")
        lines = [formatEvent(event) for event in logged.events]
        self.assertIn("opencode: " + "x" * 300, lines)
        self.assertFalse(any("x" * 301 in line for line in lines))
        self.assertEqual(
            sum(line.startswith("opencode: line") for line in lines), LINES_PER_INTERVAL - 1
        )
        self.assertIn(f"opencode: {201 - LINES_PER_INTERVAL} lines of its output not logged", lines)
        self.assertIn("opencode: after", lines)

    def test_a_drained_server_is_recycled_and_who_waited_goes_on(self):
        self.managed.start()
        self.ready()
        self.assertTrue(self.managed.taking_asks)
        self.managed.drain()
        self.assertFalse(self.managed.taking_asks)
        self.assertEqual(self.managed.unready(), "the agent is restarting to give back its memory")
        waiting = self.managed.when_ready()
        self.managed.recycle()
        old = self.spawn.last
        self.assertEqual(old.signals, ["TERM"])
        self.assertIs(self.managed.state, State.RECYCLING)
        old.protocol.processExited(killed(15))
        self.assertEqual(len(self.spawn.spawned), 2)  # started again at once, no backoff
        self.assertEqual(
            self.managed.unready(),
            "the agent is starting (it was restarted to give back its memory)",
        )
        self.assertNoResult(waiting)
        self.ready()
        self.successResultOf(waiting)
        self.assertEqual(self.managed.restarts, {"recycled": 1})
        self.assertEqual(self.managed.state, State.READY)
        self.assertIsNone(self.managed.unready())

    def test_the_gateways_stop_during_a_recycle_starts_nothing_again(self):
        self.managed.start()
        self.ready()
        self.managed.recycle()
        stopped = self.managed.stop()
        self.spawn.last.protocol.processExited(killed(15))
        self.successResultOf(stopped)
        self.assertEqual(len(self.spawn.spawned), 1)
        self.assertIs(self.managed.state, State.STOPPED)

    def test_one_that_cannot_start_fails_its_waiters_at_once(self):
        managed = Managed(self.clock, "opencode", None, 4321, "pw", {}, spawn=self.spawn)
        managed.why = "'oc' was not found on PATH"
        failure = self.failureResultOf(managed.when_ready())
        self.assertIn("will not start", failure.value.message)

    def test_it_is_ready_once_it_answers_not_at_its_listening_line(self):
        answers = [fail(ConnectionRefusedError()), fail(ConnectionRefusedError())]
        self.managed.answering = lambda: answers.pop(0) if answers else succeed(None)
        self.managed.start()
        self.ready()  # the line: not answering yet
        self.assertIs(self.managed.state, State.STARTING)
        self.clock.advance(0.1)
        self.assertIs(self.managed.state, State.STARTING)
        self.clock.advance(0.1)
        self.assertIs(self.managed.state, State.READY)

    def test_it_is_ready_once_warmed_up_whatever_that_said(self):
        logged = LogCapture(self)
        warmings = []
        self.managed.warming = lambda: warmings.append(Deferred()) or warmings[-1]
        self.managed.start()
        self.ready()
        self.assertEqual(len(warmings), 1)
        self.assertIs(self.managed.state, State.STARTING)
        self.assertEqual(self.managed.unready(), "the agent is starting")
        warmings[0].callback(None)
        self.assertIs(self.managed.state, State.READY)
        # The next start warms up again; what it found wrong is the asks' to say, and logged.
        self.spawn.last.protocol.processExited(killed())
        self.clock.advance(1)
        self.ready()
        warmings[1].errback(Failure(opencode_error("opencode has no model configured")))
        self.assertIs(self.managed.state, State.READY)
        said = [formatEvent(event) for event in logged.events]
        self.assertIn("opencode: opencode has no model configured", said)

    def test_a_warm_up_that_hangs_holds_it_only_until_its_bound(self):
        self.managed.warming = Deferred
        self.managed.start()
        self.ready()
        self.clock.advance(limits.OPENCODE_WARM_UP_WAIT - 0.1)
        self.assertIs(self.managed.state, State.STARTING)
        logged = LogCapture(self)
        self.clock.advance(0.1)
        self.assertIs(self.managed.state, State.READY)
        said = [formatEvent(event) for event in logged.events]
        self.assertIn("opencode: still loading its model providers after 10 s", said)

    def test_one_that_listens_but_never_answers_is_killed_and_started_again(self):
        self.managed.answering = lambda: fail(ConnectionRefusedError())
        self.managed.start()
        self.ready()
        self.clock.advance(limits.OPENCODE_READY_WAIT + 0.2)
        process = self.spawn.last
        self.assertEqual(process.signals, ["KILL"])
        self.assertIn("did not answer within", self.managed.why)
        process.protocol.processExited(killed())
        self.assertIs(self.managed.state, State.RESTARTING)

    def test_a_signal_to_one_that_just_exited_is_not_an_error(self):
        self.managed.start()
        self.ready()

        def gone(name):
            raise ProcessExitedAlready()

        self.spawn.last.signalProcess = gone
        stopped = self.managed.stop()  # no raise
        self.clock.advance(limits.OPENCODE_STOP_GRACE)  # the KILL: no raise either
        self.spawn.last.protocol.processExited(killed(15))
        self.successResultOf(stopped)

    def test_its_stop_tells_who_waits_for_it(self):
        self.managed.start()
        waiting = self.managed.when_ready()
        self.managed.stop()
        self.assertIn("shutting down", self.failureResultOf(waiting).value.message)
