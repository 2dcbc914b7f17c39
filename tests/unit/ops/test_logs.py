"""The ``--logger`` observers: journald lines with a priority, JSON lines."""

import io

import orjson
from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from trapsandbox.ops import logs


def failing():
    raise ValueError("bad\nthing")


class LogTestCase(SynchronousTestCase):
    factory = staticmethod(logs.journald)

    def setUp(self):
        self.patch(logs.os, "environ", {})
        self.stream = io.StringIO()
        self.log = Logger(
            namespace="trapsandbox.computers.protocol", observer=self.factory(self.stream)
        )

    def lines(self):
        return self.stream.getvalue().splitlines(keepends=True)


class JournaldTests(LogTestCase):
    def test_levels_become_syslog_priorities(self):
        self.log.info("{traposId} connected", traposId="7:")
        self.log.warn("careful")
        self.log.error("broken")
        self.log.critical("on fire")
        self.assertEqual(
            self.lines(),
            [
                "<6>[trapsandbox.computers.protocol] 7: connected\n",
                "<4>[trapsandbox.computers.protocol] careful\n",
                "<3>[trapsandbox.computers.protocol] broken\n",
                "<2>[trapsandbox.computers.protocol] on fire\n",
            ],
        )

    def test_a_traceback_is_one_line(self):
        try:
            failing()
        except ValueError:
            self.log.failure("handling {what} failed", what="hello")
        [line] = self.lines()
        # log.failure is critical by default: <2>.
        self.assertTrue(
            line.startswith("<2>[trapsandbox.computers.protocol] handling hello failed\\n"), line
        )
        self.assertIn("Traceback (most recent call last):\\n", line)
        self.assertTrue(line.endswith("ValueError: bad\\nthing\n"), line)
        self.assertNotIn("\r", line)

    def test_multi_line_messages_are_escaped(self):
        self.log.info("one\ntwo\r\nthree")
        self.assertEqual(self.lines(), ["<6>[trapsandbox.computers.protocol] one\\ntwo\\nthree\n"])

    def test_debug_is_dropped_by_default(self):
        self.log.debug("noise")
        self.log.info("signal")
        self.assertEqual(self.lines(), ["<6>[trapsandbox.computers.protocol] signal\n"])

    def test_autobahns_debug_lines_never_pass_even_at_debug(self):
        # They carry whole upgrade requests: an operator socket's Authorization header.
        self.patch(logs.os, "environ", {"SANDBOX_LOG_LEVEL": "debug"})
        stream = io.StringIO()
        observer = logs.journald(stream)
        for namespace in (
            "autobahn.websocket.protocol.WebSocketServerProtocol",
            "trapsandbox.web.app",
        ):
            observer(
                {
                    "log_namespace": namespace,
                    "log_level": LogLevel.debug,
                    "log_format": "x-" + namespace,
                }
            )
        self.assertNotIn("x-autobahn", stream.getvalue())
        self.assertIn("x-trapsandbox.web.app", stream.getvalue())

    def test_level_from_the_environment(self):
        for name, expected in (("debug", 2), ("warning", 0), ("nonsense", 1)):
            self.patch(logs.os, "environ", {"SANDBOX_LOG_LEVEL": name})
            stream = io.StringIO()
            log = Logger(namespace="x", observer=logs.journald(stream))
            log.debug("d")
            log.info("i")
            self.assertEqual(len(stream.getvalue().splitlines()), expected, name)

    def test_legacy_events(self):
        """twisted.python.log events (e.g. from Twisted itself) carry a system, not a namespace."""
        observer = logs.journald(self.stream)
        observer(
            {
                "log_level": LogLevel.info,
                "log_format": "{message}",
                "message": "(TCP Port 4444 Closed)",
                "log_system": "-",
                "log_namespace": "log_legacy",
                "log_time": 0,
            }
        )
        self.assertEqual(self.lines(), ["<6>[log_legacy] (TCP Port 4444 Closed)\n"])

    def test_every_line_is_flushed(self):
        flushed = []

        class Stream(io.StringIO):
            def flush(self):
                flushed.append(self.getvalue())

        stream = Stream()
        Logger(namespace="x", observer=logs.journald(stream)).info("now")
        self.assertEqual(flushed, ["<6>[x] now\n"])

    def test_a_closed_stream_is_survived(self):
        stream = io.StringIO()
        observer = logs.journald(stream)
        stream.close()
        Logger(namespace="x", observer=observer).info("into the void")


class JSONTests(LogTestCase):
    factory = staticmethod(logs.json)

    def test_one_object_per_line(self):
        self.log.warn("{traposId} from {peer} refused", traposId="7:", peer="tcp4:1.2.3.4:5")
        [line] = self.lines()
        event = orjson.loads(line)
        self.assertEqual(
            {key: event[key] for key in event if key != "time"},
            {
                "level": "warn",
                "priority": 4,
                "namespace": "trapsandbox.computers.protocol",
                "message": "7: from tcp4:1.2.3.4:5 refused",
                "traposId": "7:",
                "peer": "tcp4:1.2.3.4:5",
            },
        )
        self.assertRegex(event["time"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00$")

    def test_traceback_is_a_field(self):
        self.log.failure("oops", Failure(ValueError("bad")))
        [line] = self.lines()
        event = orjson.loads(line)
        self.assertEqual((event["level"], event["message"]), ("critical", "oops"))
        self.assertIn("ValueError: bad", event["traceback"])

    def test_unserializable_fields_are_left_out(self):
        self.log.info("{thing}", thing=object(), count=3)
        event = orjson.loads(self.lines()[0])
        self.assertNotIn("thing", event)
        self.assertEqual(event["count"], 3)
