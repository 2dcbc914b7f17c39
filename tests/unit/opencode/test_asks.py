"""
The opencode side of ``sandbox ask`` (SPEC §11) in memory: the SSE parser, the
shared event stream and ``Asks``, against a fake HTTP client whose answers and
event stream the tests drive, with recorded event shapes (NOTES-opencode.md).
"""

import os
import stat

import orjson
from hyperlink import DecodedURL
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH

from tests.harness.logcapture import LogCapture
from trapsandbox import limits
from trapsandbox.computers import wire
from trapsandbox.computers.wire import GatewayError
from trapsandbox.opencode.asks import Asks, EventStream, OpencodeClient, SSEParser, _directory_name
from trapsandbox.ops.metrics import Metrics

URL = "http://127.0.0.1:4096"
SES = "ses_1"


# -- Fakes -------------------------------------------------------------------------------


class FakeTransport:
    def __init__(self, protocol):
        self.protocol = protocol
        self.stopped = False

    def stopProducing(self):
        if not self.stopped:
            self.stopped = True
            self.protocol.connectionLost(Failure(ResponseFailed([Failure(ResponseDone())])))


class FakeResponse:
    """Enough of ``IResponse`` for ``treq.content`` and ``deliverBody``."""

    def __init__(self, code, body=b""):
        self.code = code
        self.body = body
        self.protocol = None
        self.headers = Headers()
        self.length = len(body) if body is not None else UNKNOWN_LENGTH

    def deliverBody(self, protocol):
        self.protocol = protocol
        protocol.makeConnection(FakeTransport(protocol))
        if self.body is not None:
            if self.body:
                protocol.dataReceived(self.body)
            protocol.connectionLost(Failure(ResponseDone()))


class FakeHTTP:
    """
    A treq-like client: ``request``/``get`` are recorded and answered by
    ``answers[(method, path)]`` (a JSON value, ``(code, value)``, an exception or
    a Deferred); ``GET /global/event`` answers from ``streams``.
    """

    def __init__(self):
        self.calls = []
        self.answers = {
            ("GET", "/config"): {
                "mcp": {"trapsandbox": {"type": "remote", "url": "http://gw/mcp"}}
            },
            ("POST", "/mcp"): True,
            ("POST", "/session"): lambda body: {"id": f"ses_{self.sessions + 1}"},
            ("GET", "/session/status"): {},
        }
        self.sessions = 0
        self.stream_gets = []  # the Deferreds of GET /global/event, newest last
        self.auto_stream = True
        self.stream = None  # the open stream's FakeResponse

    def request(self, method, url, **kwargs):
        url = DecodedURL.fromText(str(url)) if not isinstance(url, DecodedURL) else url
        path = "/" + "/".join(url.path)
        body = orjson.loads(kwargs["data"]) if "data" in kwargs else None
        self.calls.append((method, path, url.get("directory")[:1], body, kwargs.get("auth")))
        key = (method, path)
        if key not in self.answers:
            prefix = "/".join(path.split("/")[:2])  # /session/ses_x/... -> /session
            parts = path.split("/")
            key = (method, "/".join(parts[:2] + ["*"] + parts[3:]))
            if key not in self.answers:
                key = (method, prefix + "/*")
        answer = self.answers.get(key, None)
        if callable(answer):
            answer = answer(body)
        if key == ("POST", "/session"):
            self.sessions += 1
        if isinstance(answer, Deferred):
            return answer
        if isinstance(answer, Exception):
            return fail(answer)
        code, value = answer if isinstance(answer, tuple) else (200, answer)
        return succeed(FakeResponse(code, b"" if value is None else orjson.dumps(value)))

    def get(self, url, **kwargs):
        if str(url).endswith("/global/event"):
            self.stream_kwargs = kwargs
            d = Deferred()
            self.stream_gets.append(d)
            if self.auto_stream:
                self.open()
            return d
        return self.request("GET", url, **kwargs)

    def open(self, code=200):
        response = FakeResponse(code, None if code == 200 else b"")
        self.stream = response
        self.stream_gets[-1].callback(response)

    def send(self, data):
        self.stream.protocol.dataReceived(data)

    def event(self, kind, directory="/d", **properties):
        payload = {"id": "evt", "type": kind, "properties": properties}
        self.send(b"data: " + orjson.dumps({"directory": directory, "payload": payload}) + b"\n\n")

    def drop(self):
        self.stream.protocol.connectionLost(Failure(ResponseFailed([Failure(ResponseDone())])))

    def paths(self, method=None):
        return [c[1] for c in self.calls if method is None or c[0] == method]


# -- The SSE parser ---------------------------------------------------------------------


class SSEParserTests(SynchronousTestCase):
    def setUp(self):
        self.events = []
        self.parser = SSEParser(self.events.append)

    def test_an_event_split_across_chunks_mid_line_is_one_event(self):
        line = (
            b'data: {"id":"1","type":"message.part.delta","properties":{"sessionID":"ses_1",'
            b'"messageID":"msg_1","partID":"prt_1","field":"text","delta":"Hello"}}\r\n\r\n'
        )
        for i in range(0, len(line), 7):
            self.parser.feed(line[i : i + 7])
        self.assertEqual(len(self.events), 1)
        self.assertEqual(self.events[0]["properties"]["delta"], "Hello")

    def test_heartbeats_comments_and_other_fields(self):
        self.parser.feed(
            b": keep-alive\n"
            b"event: message\nid: 7\nretry: 1000\n"
            b'data: {"type":"server.heartbeat","properties":{}}\n\n'
            b'data: {"type":"server.connected","properties":{}}\n\n'
        )
        self.assertEqual([e["type"] for e in self.events], ["server.heartbeat", "server.connected"])

    def test_malformed_data_is_dropped_and_the_stream_goes_on(self):
        self.parser.feed(
            b"data: {not json\n\n"
            b"data: [1, 2]\n\n"
            b'data: "a string"\n\n'
            b"garbage without a colon\n"
            b'data: {"type":"session.idle","properties":{"sessionID":"ses_1"}}\n\n'
        )
        self.assertEqual(
            self.events, [{"type": "session.idle", "properties": {"sessionID": "ses_1"}}]
        )

    def test_several_data_lines_make_one_event(self):
        self.parser.feed(b'data: {"type":\ndata: "x", "properties": {}}\n\n')
        self.assertEqual(self.events, [{"type": "x", "properties": {}}])

    def test_no_event_before_the_blank_line(self):
        self.parser.feed(b'data: {"type":"x","properties":{}}\n')
        self.assertEqual(self.events, [])
        self.parser.feed(b"\n")
        self.assertEqual(len(self.events), 1)

    def test_an_overlong_line_is_dropped(self):
        parser = SSEParser(self.events.append, max_line=64)
        parser.feed(b'data: {"type":"big","properties":{"x":"' + b"a" * 100)
        parser.feed(b"a" * 100 + b'"}}\n\n')
        parser.feed(b'data: {"type":"small","properties":{}}\n\n')
        self.assertEqual([e["type"] for e in self.events], ["small"])

    def test_the_rest_of_an_overlong_line_is_not_taken_for_a_line(self):
        parser = SSEParser(self.events.append, max_line=64)
        parser.feed(b"data: " + b"a" * 100)
        parser.feed(b'data: {"type":"tail","properties":{}}\n\n')  # still the same line
        parser.feed(b'data: {"type":"next","properties":{}}\n\n')
        self.assertEqual([e["type"] for e in self.events], ["next"])


# -- The event stream ---------------------------------------------------------------------


class EventStreamTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.http = FakeHTTP()
        self.client = OpencodeClient(self.http, self.clock, URL, password="pw")
        self.stream = EventStream(self.client, self.clock)
        self.heard = []
        self.stream.subscribe(SES, self.heard.append)
        self.successResultOf(self.stream.ready())

    def test_events_reach_their_session_only(self):
        self.http.event("message.part.delta", sessionID=SES, partID="p", delta="mine")
        self.http.event("message.part.delta", sessionID="ses_other", partID="p", delta="theirs")
        self.http.event("plugin.added", name="x")
        self.http.event("server.heartbeat")
        self.http.event("message.updated", info={"id": "m", "sessionID": SES, "role": "user"})
        self.http.event("message.part.updated", part={"id": "p", "sessionID": SES, "type": "text"})
        self.http.event("message.part.updated", part={"id": "q", "sessionID": "ses_other"})
        self.assertEqual(
            [e["type"] for e in self.heard],
            ["message.part.delta", "message.updated", "message.part.updated"],
        )
        self.assertEqual(self.heard[0]["properties"]["delta"], "mine")

    def test_one_stream_for_every_subscriber(self):
        self.stream.subscribe("ses_2", lambda e: None)
        self.successResultOf(self.stream.ready())
        self.assertEqual(len(self.http.stream_gets), 1)

    def test_a_dropped_stream_reconnects_with_backoff(self):
        reconnects = []
        self.stream.on_reconnect.append(lambda: reconnects.append(self.clock.seconds()))
        self.http.auto_stream = False
        self.http.drop()
        self.assertFalse(self.stream.connected)
        self.clock.advance(limits.EVENT_RECONNECT_MIN - 0.01)
        self.assertEqual(len(self.http.stream_gets), 1)
        self.clock.advance(0.01)
        self.assertEqual(len(self.http.stream_gets), 2)
        # It fails: the next try comes twice as late.
        self.http.stream_gets[-1].errback(ConnectionRefusedError())
        self.clock.advance(2 * limits.EVENT_RECONNECT_MIN - 0.01)
        self.assertEqual(len(self.http.stream_gets), 2)
        self.clock.advance(0.01)
        self.assertEqual(len(self.http.stream_gets), 3)
        self.http.open()
        self.assertTrue(self.stream.connected)
        self.assertEqual(len(reconnects), 1)
        self.http.event("session.idle", sessionID=SES)
        self.assertEqual(self.heard[-1]["type"], "session.idle")
        # Back up: the backoff starts over.
        self.http.drop()
        self.clock.advance(limits.EVENT_RECONNECT_MIN)
        self.assertEqual(len(self.http.stream_gets), 4)

    def test_the_backoff_stops_growing(self):
        self.http.auto_stream = False
        self.http.drop()
        for _ in range(10):
            self.clock.advance(limits.EVENT_RECONNECT_MAX)
            self.http.stream_gets[-1].errback(ConnectionRefusedError())
        count = len(self.http.stream_gets)
        self.clock.advance(limits.EVENT_RECONNECT_MAX)
        self.assertEqual(len(self.http.stream_gets), count + 1)

    def test_a_silent_stream_is_dropped_and_reopened(self):
        self.clock.advance(limits.EVENT_SILENCE_TIMEOUT - 1)
        self.http.event("server.heartbeat")  # a heartbeat keeps it alive
        self.clock.advance(limits.EVENT_SILENCE_TIMEOUT - 1)
        self.assertTrue(self.stream.connected)
        self.assertEqual(len(self.http.stream_gets), 1)
        self.clock.advance(1)
        self.assertFalse(self.stream.connected)
        self.clock.advance(limits.EVENT_RECONNECT_MIN)
        self.assertEqual(len(self.http.stream_gets), 2)
        self.assertTrue(self.stream.connected)

    def test_the_stream_is_opened_with_the_credentials(self):
        self.assertEqual(self.http.stream_kwargs["auth"], ("opencode", "pw"))
        self.assertTrue(self.http.stream_kwargs["unbuffered"])  # events as they come


# -- Asks -----------------------------------------------------------------------------------


class AskTestsMixin:
    def setUp(self):
        self.clock = Clock()
        self.http = FakeHTTP()
        self.client = OpencodeClient(self.http, self.clock, URL, password="pw")
        self.metrics = Metrics()
        self.root = os.path.abspath(self.mktemp())
        os.mkdir(self.root, 0o700)  # as state.prepare leaves it at start
        self.asks = Asks(self.client, self.clock, self.metrics, directory=self.root)
        self.partials = []

    def ask(self, prompt="hi", trapos="1:a", account="local", message_id="m1", **payload):
        emit = self.partials.append
        return Deferred.fromCoroutine(
            self.asks.ask(
                account,
                trapos,
                frozenset({"exec"}),
                message_id,
                {"prompt": prompt, **payload},
                emit,
            )
        )

    def outcome(self, name):
        return self.metrics._asks.labels(name).value

    def assistant(self, message="msg_a", session=SES):
        self.http.event(
            "message.updated", info={"id": message, "sessionID": session, "role": "assistant"}
        )

    def busy(self, session=SES):
        self.http.event("session.status", sessionID=session, status={"type": "busy"})

    def idle(self, session=SES):
        self.http.event("session.status", sessionID=session, status={"type": "idle"})
        self.http.event("session.idle", sessionID=session)

    def tool(self, status, call="call_1", input=None, tool="trapsandbox_write_file", **state):
        self.http.event(
            "message.part.updated",
            part={
                "id": "prt_t",
                "sessionID": SES,
                "messageID": "msg_a",
                "type": "tool",
                "callID": call,
                "tool": tool,
                "state": {"status": status, "input": input or {}, **state},
            },
        )

    def permission(self, pid="per_1", call="call_1", tool="trapsandbox_write_file"):
        self.http.event(
            "permission.asked",
            id=pid,
            sessionID=SES,
            permission=tool,
            patterns=["*"],
            tool={"messageID": "msg_a", "callID": call},
        )


class AskSessionTests(AskTestsMixin, SynchronousTestCase):
    def test_an_ask_creates_a_session_with_rules_and_sends_the_prompt(self):
        d = self.ask("write a program")
        self.assertNoResult(d)
        sessions = [c for c in self.http.calls if c[:2] == ("POST", "/session")]
        (session,) = sessions
        self.assertEqual(session[3]["title"], "1:a")
        rules = {(r["permission"], r["action"]) for r in session[3]["permission"]}
        self.assertIn(("*", "deny"), rules)
        self.assertIn(("trapsandbox_write_file", "ask"), rules)
        self.assertIn(("trapsandbox_read_file", "allow"), rules)
        (prompt,) = [c for c in self.http.calls if c[1] == f"/session/{SES}/prompt_async"]
        self.assertEqual(prompt[3]["parts"], [{"type": "text", "text": "write a program"}])
        self.assertIn("1:a", prompt[3]["system"])
        self.assertEqual(prompt[2], session[2])  # the same directory
        self.assertEqual(prompt[4], ("opencode", "pw"))
        # The directory's instance got the computer's own MCP block, token and all.
        (mcp,) = [c for c in self.http.calls if c[:2] == ("POST", "/mcp")]
        token = mcp[3]["config"]["headers"]["Authorization"].encode()
        self.assertEqual(self.asks.scope_of(token), ("local", "1:a"))
        self.assertTrue(os.path.exists(os.path.join(mcp[2][0], "opencode.json")))

    def test_yes_allows_the_changes(self):
        self.ask("x", yes=True)
        (session,) = [c for c in self.http.calls if c[:2] == ("POST", "/session")]
        self.assertIn(
            {"permission": "trapsandbox_write_file", "pattern": "*", "action": "allow"},
            session[3]["permission"],
        )

    def test_one_session_per_account_and_computer_and_new_starts_another(self):
        d = self.ask()
        self.busy()
        self.idle()
        self.successResultOf(d)
        self.ask(message_id="m2")
        self.assertEqual(self.http.sessions, 1)  # the same computer keeps its session
        self.idle()
        self.ask(trapos="2:b")
        self.assertEqual(self.http.sessions, 2)
        self.ask(account="other")  # another account's 1:a is another computer
        self.assertEqual(self.http.sessions, 3)
        self.assertEqual(
            {k: c.session_id for k, c in self.asks.conversations.items()},
            {("local", "1:a"): "ses_1", ("local", "2:b"): "ses_2", ("other", "1:a"): "ses_3"},
        )
        self.assertEqual(self.asks.conversations[("local", "1:a")].session_id, "ses_1")
        self.http.event("session.idle", sessionID="ses_1")  # not started: ignored
        self.assertIn(("local", "1:a"), self.asks.runs)

    def test_new_starts_a_fresh_session(self):
        d = self.ask()
        self.busy()
        self.idle()
        self.successResultOf(d)
        self.ask(new=True)
        self.assertEqual(self.http.sessions, 2)
        self.assertEqual(self.asks.conversations[("local", "1:a")].session_id, "ses_2")

    def test_one_ask_at_a_time_per_computer(self):
        first = self.ask()
        second = self.ask(message_id="m2")
        error = self.failureResultOf(second, GatewayError).value
        self.assertEqual(error.code, wire.OVERLOADED)
        self.assertNoResult(first)
        self.assertEqual(self.http.sessions, 1)
        self.assertEqual(self.http.paths("POST").count(f"/session/{SES}/prompt_async"), 1)
        # Another computer may ask meanwhile.
        self.assertNoResult(self.ask(trapos="2:b"))

    def test_bad_payloads(self):
        for payload in ({"prompt": ""}, {"prompt": 3}, {"prompt": "x", "new": "yes"}):
            d = Deferred.fromCoroutine(
                self.asks.ask("local", "1:a", frozenset(), "m", payload, self.partials.append)
            )
            self.assertEqual(self.failureResultOf(d, GatewayError).value.code, wire.BAD_REQUEST)
        self.assertEqual(self.http.calls, [])


class AskDirectoryTests(AskTestsMixin, SynchronousTestCase):
    """Each computer's directory is the gateway's own (SPEC §11, issue 19 finding 4)."""

    def directory(self, account="local", trapos="1:a"):
        return os.path.join(self.root, _directory_name(account, trapos))

    def refused(self, reason):
        captured = LogCapture(self)
        d = self.ask()
        error = self.failureResultOf(d, GatewayError).value
        self.assertEqual(error.code, wire.OPENCODE_ERROR)
        self.assertIn("ask directory for this computer is not usable", error.message)
        self.assertIn(reason, error.message)
        self.assertEqual(self.outcome("opencode_error"), 1)
        self.assertNotIn("/session", self.http.paths("POST"))  # no session, no prompt
        self.assertNotIn("/mcp", self.http.paths("POST"))
        self.assertTrue(
            [t for t in captured.errors() if self.directory() in t and reason in t],
            captured.texts(),
        )
        self.assertNotIn(("local", "1:a"), self.asks.runs)  # the computer may ask again
        return error

    def test_the_directory_and_opencode_json_are_private(self):
        self.ask()
        path = self.directory()
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o700)
        self.assertEqual(stat.S_IMODE(os.stat(os.path.join(path, "opencode.json")).st_mode), 0o600)

    def test_a_planted_symbolic_link_at_opencode_json_is_refused_and_its_target_untouched(self):
        victim = os.path.abspath(self.mktemp())
        with open(victim, "wb") as f:
            f.write(b"the gateway user's file")
        os.mkdir(self.directory(), 0o700)
        os.symlink(victim, os.path.join(self.directory(), "opencode.json"))
        self.refused("a symbolic link")
        with open(victim, "rb") as f:
            self.assertEqual(f.read(), b"the gateway user's file")

    def test_a_directory_writable_by_others_is_refused(self):
        os.mkdir(self.directory())
        os.chmod(self.directory(), 0o777)
        self.refused("writable by group or others")
        self.assertEqual(os.listdir(self.directory()), [])  # no token left in it

    def test_another_users_directory_is_refused(self):
        if os.geteuid() != 0:
            self.skipTest("only root can give a directory to another user")
        os.mkdir(self.directory(), 0o700)
        os.chown(self.directory(), 65534, 65534)
        self.refused("belongs to another user")

    def test_a_symbolic_link_for_the_directory_is_refused(self):
        elsewhere = os.path.abspath(self.mktemp())
        os.mkdir(elsewhere, 0o700)
        os.symlink(elsewhere, self.directory())
        self.refused("a symbolic link")
        self.assertEqual(os.listdir(elsewhere), [])

    def test_names_are_plain_whatever_the_traposid_and_account(self):
        for account, trapos in (("local", "../../x:.."), ("a/../../b", "7:a/b"), ("x", "7:..")):
            name = _directory_name(account, trapos)
            self.assertNotIn("/", name)
            self.assertNotIn("..", name)
        self.assertTrue(_directory_name("local", "7:base").startswith("7-"))

    def test_the_mcp_block_outlasts_the_longest_tool_call(self):
        # Issue 26: the operator's block may say 5000 ms; opencode would cut calls at 5.5 s.
        self.http.answers[("GET", "/config")] = {
            "mcp": {"trapsandbox": {"type": "remote", "url": "http://gw/mcp", "timeout": 5000}}
        }
        self.ask()
        (mcp,) = [c for c in self.http.calls if c[:2] == ("POST", "/mcp")]
        timeout = mcp[3]["config"]["timeout"]
        self.assertEqual(timeout, limits.ASK_MCP_TIMEOUT_MS)
        self.assertGreaterEqual(timeout, (limits.MCP_CALL_TIMEOUT + 5) * 1000)
        with open(os.path.join(self.directory(), "opencode.json"), "rb") as f:
            self.assertEqual(orjson.loads(f.read())["mcp"]["trapsandbox"]["timeout"], timeout)


class AskBoundTests(AskTestsMixin, SynchronousTestCase):
    """Per account, at most ``max_conversations`` computers are remembered (SPEC §4)."""

    def setUp(self):
        super().setUp()
        self.asks = Asks(
            self.client, self.clock, self.metrics, directory=self.root, max_conversations=2
        )

    def asked(self, trapos, account="local"):
        d = self.ask(trapos=trapos, account=account)
        session = self.asks.conversations[(account, trapos)].session_id
        self.busy(session)
        self.idle(session)
        self.successResultOf(d)

    def token(self, account, trapos):
        for call in self.http.calls:
            if call[:2] == ("POST", "/mcp") and call[2] == [
                os.path.join(self.root, _directory_name(account, trapos))
            ]:
                token = call[3]["config"]["headers"]["Authorization"]
        return token.encode()

    def test_the_least_recently_asked_computer_is_forgotten(self):
        self.asked("1:a")
        self.asked("2:b")
        self.asked("1:a")  # 1:a is now the most recent
        first_token = self.token("local", "1:a")
        old_token = self.token("local", "2:b")
        self.asked("3:c")
        self.assertEqual(set(self.asks.conversations), {("local", "1:a"), ("local", "3:c")})
        self.assertIsNone(self.asks.scope_of(old_token))  # its token no longer works
        self.assertEqual(self.asks.scope_of(first_token), ("local", "1:a"))
        self.assertEqual(len(self.asks._tokens), 2)
        self.assertEqual(len(self.asks._token_of), 2)
        self.assertEqual(len(self.asks._scoped), 2)
        # Asking again starts a new session with a new token and block.
        sessions = self.http.sessions
        self.asked("2:b")
        self.assertEqual(self.http.sessions, sessions + 1)
        self.assertEqual(self.asks.scope_of(self.token("local", "2:b")), ("local", "2:b"))
        self.assertEqual(set(self.asks.conversations), {("local", "3:c"), ("local", "2:b")})

    def test_the_bound_is_per_account(self):
        self.asked("1:a")
        self.asked("2:b")
        self.asked("1:a", account="other")
        self.asked("2:b", account="other")
        self.assertEqual(len(self.asks.conversations), 4)

    def test_a_computer_asking_now_is_not_forgotten(self):
        self.ask(trapos="1:a")  # still running
        self.asked("2:b")
        self.asked("3:c")
        self.assertIn(("local", "1:a"), self.asks.conversations)
        self.assertEqual(set(self.asks.conversations), {("local", "1:a"), ("local", "3:c")})


class AskStreamingTests(AskTestsMixin, SynchronousTestCase):
    def setUp(self):
        super().setUp()
        self.done = self.ask()
        self.http.event("message.updated", info={"id": "msg_u", "sessionID": SES, "role": "user"})
        self.http.event("session.status", sessionID=SES, status={"type": "busy"})
        self.assistant()

    def delta(self, text, part="prt_1", message="msg_a"):
        self.http.event(
            "message.part.delta",
            sessionID=SES,
            messageID=message,
            partID=part,
            field="text",
            delta=text,
        )

    def test_text_deltas_are_batched_and_the_answer_ends_on_idle(self):
        for word in ("Hel", "lo", ", ", "world"):
            self.delta(word)
        self.assertEqual(self.partials, [])  # not one partial per delta
        self.clock.advance(limits.ASK_PARTIAL_INTERVAL)
        self.assertEqual(self.partials, [{"type": "text_delta", "text": "Hello, world"}])
        self.delta("!")
        self.assertNoResult(self.done)
        self.idle()
        self.assertEqual(self.partials[-1], {"type": "text_delta", "text": "!"})
        self.assertEqual(
            self.successResultOf(self.done), {"sessionId": SES, "text": "Hello, world!"}
        )
        self.assertEqual(self.outcome("ok"), 1)
        self.assertNotIn(("local", "1:a"), self.asks.runs)

    def test_a_text_part_update_without_deltas_is_sent(self):
        part = {"id": "prt_1", "sessionID": SES, "messageID": "msg_a", "type": "text"}
        self.http.event("message.part.updated", part={**part, "text": "Whole"})
        self.http.event("message.part.updated", part={**part, "text": "Who"})  # never shrinks
        self.http.event(
            "message.part.updated", part={**part, "id": "s", "text": "x", "synthetic": True}
        )
        self.idle()
        self.assertEqual(self.partials, [{"type": "text_delta", "text": "Whole"}])
        self.assertEqual(self.successResultOf(self.done)["text"], "Whole")

    def test_the_users_own_text_is_not_echoed(self):
        self.delta("my prompt", part="prt_u", message="msg_u")
        self.delta("answer")
        self.idle()
        self.assertEqual(self.successResultOf(self.done)["text"], "answer")

    def test_a_large_burst_is_sent_at_once_in_bounded_pieces(self):
        self.delta("x" * (limits.ASK_PARTIAL_MAX_CHARS * 2 + 5))
        self.assertEqual(
            [len(p["text"]) for p in self.partials],
            [limits.ASK_PARTIAL_MAX_CHARS, limits.ASK_PARTIAL_MAX_CHARS, 5],
        )

    def test_a_second_text_part_is_a_new_paragraph(self):
        self.delta("one", part="prt_1")
        self.clock.advance(limits.ASK_PARTIAL_INTERVAL)
        self.tool("running", input={"path": "/a"})
        self.delta("two", part="prt_2")
        self.idle()
        texts = [p["text"] for p in self.partials if p["type"] == "text_delta"]
        self.assertEqual(texts, ["one", "\n\ntwo"])

    def test_tool_partials(self):
        self.delta("Let me write it.")
        self.tool("pending")
        self.tool("running", input={"path": "/hello.lua", "content": "x"})
        self.tool("running", input={"path": "/hello.lua", "content": "x"})
        self.tool("completed", input={"path": "/hello.lua"}, output="wrote 1 byte")
        self.tool("error", call="call_2", tool="trapsandbox_run_command", error="no such file")
        self.assertEqual(
            self.partials,
            [
                {"type": "text_delta", "text": "Let me write it."},  # flushed before the tool
                {"type": "tool", "name": "trapsandbox_write_file", "status": "running"},
                {"type": "tool", "name": "trapsandbox_write_file", "status": "completed"},
                {
                    "type": "tool",
                    "name": "trapsandbox_run_command",
                    "status": "error",
                    "error": "no such file",
                },
            ],
        )

    def test_a_failed_run_is_an_opencode_error(self):
        self.http.event(
            "session.error",
            sessionID=SES,
            error={"name": "ProviderModelNotFoundError", "data": {"message": "no model fake/x"}},
        )
        self.idle()
        error = self.failureResultOf(self.done, GatewayError).value
        self.assertEqual(error.code, wire.OPENCODE_ERROR)
        self.assertIn("ProviderModelNotFoundError", error.message)
        self.assertIn("is a model configured", error.message)
        self.assertEqual(self.outcome("run_failed"), 1)

    def test_tokens_are_counted(self):
        self.http.event(
            "message.updated",
            info={
                "id": "msg_a",
                "sessionID": SES,
                "role": "assistant",
                "tokens": {"input": 120, "output": 30},
            },
        )
        self.idle()
        self.successResultOf(self.done)
        self.assertEqual(self.metrics._ask_tokens.labels("input").value, 120)
        self.assertEqual(self.metrics._ask_tokens.labels("output").value, 30)

    def test_the_ten_minute_bound(self):
        self.assertEqual(limits.ASK_TIMEOUT, 600)
        self.clock.advance(limits.ASK_TIMEOUT - 1)
        self.assertNoResult(self.done)
        self.clock.advance(1)
        error = self.failureResultOf(self.done, GatewayError).value
        self.assertEqual(error.code, wire.TIMEOUT)
        self.assertIn("10 minutes", error.message)
        self.assertIn(f"/session/{SES}/abort", self.http.paths("POST"))
        self.assertEqual(self.outcome("timeout"), 1)
        self.assertNotIn(("local", "1:a"), self.asks.runs)

    def test_the_computer_leaving_aborts_the_run(self):
        def gone(message):
            raise GatewayError(wire.NOT_CONNECTED, "gone")

        self.asks.runs[("local", "1:a")].emit = gone
        self.delta("x" * limits.ASK_PARTIAL_MAX_CHARS)
        self.assertIn(f"/session/{SES}/abort", self.http.paths("POST"))
        self.assertEqual(
            self.failureResultOf(self.done, GatewayError).value.code, wire.NOT_CONNECTED
        )
        self.assertEqual(self.outcome("disconnected"), 1)


class AskCancelTests(AskTestsMixin, SynchronousTestCase):
    def setUp(self):
        super().setUp()
        self.done = self.ask(message_id="m1")
        self.http.event("session.status", sessionID=SES, status={"type": "busy"})

    def test_cancel_aborts_and_the_ask_ends_cancelled(self):
        self.assertIsNone(self.asks.cancel("local", "1:a", "other-message"))
        self.assertIsNone(self.asks.cancel("local", "2:b", "m1"))
        self.assertNotIn(f"/session/{SES}/abort", self.http.paths("POST"))
        d = self.asks.cancel("local", "1:a", "m1")
        self.assertIsNotNone(d)
        self.assertIn(f"/session/{SES}/abort", self.http.paths("POST"))
        self.assertNoResult(self.done)
        # What opencode sends after an abort.
        self.http.event("session.error", sessionID=SES, error={"name": "MessageAbortedError"})
        self.idle()
        error = self.failureResultOf(self.done, GatewayError).value
        self.assertEqual(error.code, wire.CANCELLED)
        self.assertEqual(self.outcome("cancelled"), 1)
        # The computer can ask again, in the same session.
        self.ask(message_id="m2")
        self.assertEqual(self.http.sessions, 1)

    def test_cancel_ends_the_ask_even_if_opencode_never_says_idle(self):
        self.asks.cancel("local", "1:a", "m1")
        self.clock.advance(limits.ASK_ABORT_GRACE)
        self.assertEqual(self.failureResultOf(self.done, GatewayError).value.code, wire.CANCELLED)


class AskPermissionTests(AskTestsMixin, SynchronousTestCase):
    def setUp(self):
        super().setUp()
        self.done = self.ask()
        self.assistant()

    def permissions(self):
        return [p for p in self.partials if p["type"] == "permission"]

    def test_a_permission_shows_the_known_input_and_the_reply_goes_to_opencode(self):
        self.tool("running", input={"path": "/hello.lua", "content": "print(1)\n"})
        self.permission()
        self.assertEqual(
            self.permissions(),
            [
                {
                    "type": "permission",
                    "id": "per_1",
                    "tool": "trapsandbox_write_file",
                    "detail": "/hello.lua (9 bytes)",
                }
            ],
        )
        self.successResultOf(self.asks.reply("local", "1:a", "per_1", "once"))
        (call,) = [c for c in self.http.calls if c[1] == "/permission/per_1/reply"]
        self.assertEqual((call[0], call[3]), ("POST", {"reply": "once"}))
        self.assertEqual(call[2], [self.asks.conversations[("local", "1:a")].directory])
        # Answered once: a second answer is refused.
        self.assertRaises(GatewayError, self.asks.reply, "local", "1:a", "per_1", "always")

    def test_replies_are_checked(self):
        self.tool("running", input={"command": "ls"}, tool="trapsandbox_run_command")
        self.permission(tool="trapsandbox_run_command")
        self.assertEqual(self.permissions()[0]["detail"], "ls")
        with self.assertRaises(GatewayError) as caught:
            self.asks.reply("local", "1:a", "per_1", "maybe")
        self.assertEqual(caught.exception.code, wire.BAD_REQUEST)
        # Another computer cannot answer this one's request.
        self.assertRaises(GatewayError, self.asks.reply, "local", "2:b", "per_1", "once")
        self.assertRaises(GatewayError, self.asks.reply, "local", "1:a", "per_x", "once")
        self.assertEqual([c for c in self.http.calls if "/permission/" in c[1]], [])

    def test_a_permission_before_the_input_waits_for_the_tools_update(self):
        self.http.answers[("GET", "/session/*/message/msg_a")] = Deferred()  # slow
        self.tool("pending", tool="trapsandbox_run_command")
        self.permission(tool="trapsandbox_run_command")
        self.assertEqual(self.permissions(), [])
        self.tool(
            "running",
            input={"command": "/hello.lua", "args": ["a"]},
            tool="trapsandbox_run_command",
        )
        self.assertEqual(self.permissions()[0]["detail"], "/hello.lua a")
        self.clock.advance(limits.ASK_PERMISSION_DETAIL_WAIT)
        self.assertEqual(len(self.permissions()), 1)

    def test_a_permission_before_the_input_fetches_the_message(self):
        self.http.answers[("GET", "/session/*/message/msg_a")] = {
            "info": {"id": "msg_a"},
            "parts": [
                {"type": "text", "text": "x"},
                {
                    "type": "tool",
                    "callID": "call_1",
                    "tool": "trapsandbox_run_lua",
                    "state": {"status": "running", "input": {"code": "a()\nb()\nc()\nd()\n"}},
                },
            ],
        }
        self.permission(tool="trapsandbox_run_lua")
        self.assertIn(f"/session/{SES}/message/msg_a", self.http.paths("GET"))
        self.assertEqual(self.permissions()[0]["detail"], "a()\nb()\nc()")

    def test_without_the_input_the_pattern_is_shown_in_the_end(self):
        self.http.answers[("GET", "/session/*/message/msg_a")] = {"info": {}, "parts": []}
        self.permission()
        self.assertEqual(self.permissions(), [])
        self.clock.advance(limits.ASK_PERMISSION_DETAIL_WAIT)
        self.assertEqual(self.permissions()[0]["detail"], "*")
        self.tool("running", input={"path": "/late"})
        self.assertEqual(len(self.permissions()), 1)  # never twice

    def test_the_ask_ending_drops_a_waiting_permission(self):
        self.http.answers[("GET", "/session/*/message/msg_a")] = Deferred()
        self.permission()
        self.http.event("session.status", sessionID=SES, status={"type": "busy"})
        self.idle()
        self.successResultOf(self.done)
        self.clock.advance(limits.ASK_PERMISSION_DETAIL_WAIT)
        self.assertEqual(self.permissions(), [])
        waiting = [c for c in self.clock.getDelayedCalls() if "release" in repr(c.func)]
        self.assertEqual(waiting, [])


class AskFaultTests(AskTestsMixin, SynchronousTestCase):
    def test_opencode_down(self):
        self.http.auto_stream = False
        d = self.ask()
        self.http.stream_gets[-1].errback(ConnectionRefusedError())
        error = self.failureResultOf(d, GatewayError).value
        self.assertEqual(error.code, wire.OPENCODE_ERROR)
        self.assertIn("connection refused: is opencode running?", error.message)
        self.assertIn(URL, error.message)
        self.assertNotIn(("local", "1:a"), self.asks.runs)  # the computer may ask again
        self.assertEqual(self.outcome("opencode_error"), 1)

    def test_opencode_down_for_a_call(self):
        self.http.answers[("POST", "/session")] = ConnectionRefusedError()
        error = self.failureResultOf(self.ask(), GatewayError).value
        self.assertIn("connection refused: is opencode running?", error.message)

    def test_401_on_the_stream(self):
        self.http.auto_stream = False
        d = self.ask()
        self.http.open(401)
        error = self.failureResultOf(d, GatewayError).value
        self.assertEqual(error.code, wire.OPENCODE_ERROR)
        self.assertIn("401 Unauthorized: check OPENCODE_SERVER_PASSWORD", error.message)

    def test_401_on_a_call(self):
        self.http.answers[("GET", "/config")] = (401, None)
        error = self.failureResultOf(self.ask(), GatewayError).value
        self.assertIn("401 Unauthorized", error.message)
        self.assertEqual(self.http.sessions, 0)

    def test_another_http_error_names_the_call_and_opencodes_message(self):
        self.http.answers[("POST", "/session")] = (400, {"data": {"message": "bad rule"}})
        error = self.failureResultOf(self.ask(), GatewayError).value
        self.assertIn("HTTP 400 to POST /session: bad rule", error.message)

    def test_an_unanswered_call_times_out(self):
        self.http.answers[("POST", "/session")] = Deferred()
        d = self.ask()
        self.clock.advance(limits.ASK_CALL_TIMEOUT)
        self.assertIn("no answer in time", self.failureResultOf(d, GatewayError).value.message)

    def test_no_url(self):
        asks = Asks(OpencodeClient(self.http, self.clock, ""), self.clock, directory=self.mktemp())
        d = Deferred.fromCoroutine(asks.ask("local", "1:a", frozenset(), "m", {"prompt": "x"}, id))
        self.assertIn("OPENCODE_URL", self.failureResultOf(d, GatewayError).value.message)

    def test_the_stream_dropping_mid_answer_and_the_session_idle_meanwhile(self):
        d = self.ask()
        self.assistant()
        self.http.event(
            "message.part.delta", sessionID=SES, messageID="msg_a", partID="p", delta="Half"
        )
        self.http.auto_stream = False
        self.http.drop()
        self.assertNoResult(d)
        self.clock.advance(limits.EVENT_RECONNECT_MIN)
        self.http.stream_gets[-1].errback(ConnectionRefusedError())
        self.clock.advance(2 * limits.EVENT_RECONNECT_MIN)
        self.assertNotIn("/session/status", self.http.paths("GET"))
        self.http.open()  # back: opencode says the session is not busy any more
        self.assertIn("/session/status", self.http.paths("GET"))
        self.assertEqual(self.successResultOf(d), {"sessionId": SES, "text": "Half"})

    def test_the_stream_dropping_while_the_session_is_still_busy(self):
        d = self.ask()
        self.assistant()
        self.http.answers[("GET", "/session/status")] = {SES: {"type": "busy"}}
        self.http.drop()
        self.clock.advance(limits.EVENT_RECONNECT_MIN)
        self.assertIn("/session/status", self.http.paths("GET"))
        self.assertNoResult(d)  # still running: its events come on the new stream
        self.http.event(
            "message.part.delta", sessionID=SES, messageID="msg_a", partID="p", delta="Done"
        )
        self.idle()
        self.assertEqual(self.successResultOf(d)["text"], "Done")
