"""
The shared opencode event stream (``opencode.events``): dispatch by session,
one stream for all, reconnection with backoff, silence; an ask when the
stream cannot open.
"""

import json

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from tests.unit.opencode.helpers import SES, URL, AskTestsMixin, FakeHTTP
from trapsandbox import errors, limits
from trapsandbox.errors import GatewayError
from trapsandbox.opencode.client import OpencodeClient
from trapsandbox.opencode.events import EventStream


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

    def test_events_of_nobody_are_not_decoded(self):
        decoded = []
        real = orjson.loads
        self.patch(orjson, "loads", lambda data: decoded.append(data) or real(data))
        self.http.event("plugin.added", name="x")
        self.http.event("server.heartbeat")
        self.http.event("message.part.delta", sessionID="ses_other", delta="theirs")
        self.http.send(
            b'data: {"payload":{"type":"sync","syncEvent":{"sessionID":"%s"}}}\n\n' % SES.encode()
        )
        self.http.event("session.idle", sessionID=SES)
        self.assertEqual(len(decoded), 1)
        self.assertEqual([e["type"] for e in self.heard], ["session.idle"])

    def test_one_stream_for_every_subscriber(self):
        self.stream.subscribe("ses_2", lambda e: None)
        self.successResultOf(self.stream.ready())
        self.assertEqual(len(self.http.stream_gets), 1)

    def test_reconnect_abandons_a_hanging_attempt_for_a_new_one(self):
        # opencode restarted by the gateway (``managed``): an attempt sent while it was not
        # answering may hang until its bound; the asks waiting for the stream wait for the new.
        self.http.auto_stream = False
        self.http.drop()
        self.clock.advance(limits.EVENT_RECONNECT_MIN)
        hanging = self.http.stream_gets[-1]
        waiting = self.stream.ready()
        self.stream.reconnect()
        self.assertTrue(hanging.called)  # cancelled, its failure ignored
        self.assertNoResult(waiting)  # not failed with it
        self.assertEqual(len(self.http.stream_gets), 3)
        self.http.open()
        self.successResultOf(waiting)
        self.assertTrue(self.stream.connected)
        self.stream.reconnect()  # connected: nothing
        self.assertEqual(len(self.http.stream_gets), 3)

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


class StreamFaultTests(AskTestsMixin, SynchronousTestCase):
    def test_opencode_down(self):
        self.http.auto_stream = False
        d = self.ask()
        self.http.stream_gets[-1].errback(ConnectionRefusedError())
        error = self.failureResultOf(d, GatewayError).value
        self.assertEqual(error.code, errors.OPENCODE_ERROR)
        self.assertIn("connection refused: is opencode running?", error.message)
        self.assertIn(URL, error.message)
        self.assertNotIn(("local", "1:a"), self.asks.runs)  # the computer may ask again
        self.assertEqual(self.outcome("opencode_error"), 1)

    def test_401_on_the_stream(self):
        self.http.auto_stream = False
        d = self.ask()
        self.http.open(401)
        error = self.failureResultOf(d, GatewayError).value
        self.assertEqual(error.code, errors.OPENCODE_ERROR)
        self.assertIn("401 Unauthorized: check OPENCODE_SERVER_PASSWORD", error.message)


# Session ids, the listened one among them, with what JSON escapes or spells otherwise.
_IDS = st.sampled_from([SES, "ses_other", 'ses_"q', "ses_\\b", "ses_\u00e9", "", "sessionID"])
_HOLDERS = st.sampled_from(["properties", "info", "part", "elsewhere"])


@st.composite
def _events(draw):
    properties = {"text": draw(st.sampled_from(['"sessionID":"' + SES + '"', "x", ""]))}
    for _ in range(draw(st.integers(0, 2))):
        holder, value = draw(_HOLDERS), draw(st.one_of(_IDS, st.integers(), st.none()))
        if holder == "properties":
            properties["sessionID"] = value
        else:
            properties.setdefault(holder, {})["sessionID"] = value
    event = {"type": "t", "properties": properties}
    if draw(st.booleans()):  # opencode's "sync" events: the session named, no properties
        event = {"type": "sync", "syncEvent": {"data": properties}}
    return draw(st.sampled_from([event, {"directory": "/d", "payload": event}]))


class EventFilterTests(SynchronousTestCase):
    """The events reaching a session are those decoding each event would give it, however
    the event's JSON is written."""

    @settings(max_examples=300, deadline=None)
    @given(
        events=st.lists(_events(), max_size=6),
        ensure_ascii=st.booleans(),
        separators=st.sampled_from([(",", ":"), (", ", ": "), (",", " :  ")]),
    )
    def test_the_same_events_as_decoding_every_one(self, events, ensure_ascii, separators):
        http = FakeHTTP()
        stream = EventStream(OpencodeClient(http, Clock(), URL, password="pw"), Clock())
        heard = {SES: [], 'ses_"q': [], "ses_\\b": []}
        for session, listener in heard.items():
            stream.subscribe(session, listener.append)
        self.successResultOf(stream.ready())
        expected = {session: [] for session in heard}
        reference = EventStream(OpencodeClient(FakeHTTP(), Clock(), URL), Clock())
        for session in heard:
            reference.subscribe(session, expected[session].append)
        for event in events:
            data = json.dumps(event, ensure_ascii=ensure_ascii, separators=separators)
            http.send(b"data: " + data.encode() + b"\n\n")
            reference._event(json.loads(data))  # what decoding every event gives
        self.assertEqual(heard, expected)
