"""
The SSE parser (``opencode.sse``): events split across chunks, fields and
comments, malformed data, overlong lines.
"""

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from trapsandbox.opencode.sse import SSEParser


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

    def test_data_lines_that_never_end_an_event_are_not_kept(self):
        # Issue 43: short data: lines without the blank line that ends an event once grew
        # the parser's data buffer without bound.
        parser = SSEParser(self.events.append, max_line=64)
        for _ in range(1000):
            parser.feed(b"data: " + b"a" * 20 + b"\n")
        self.assertLessEqual(parser._data_bytes, 64)
        self.assertLessEqual(sum(len(line) for line in parser._data), 64)
        parser.feed(b"\n")  # the overlong event ends here, dropped
        parser.feed(b'data: {"type":"next",\ndata: "properties":{}}\n\n')
        self.assertEqual([e["type"] for e in self.events], ["next"])


def _reference(stream: bytes, max_line: int) -> list:
    """What a stream means, line by line (the whole lines of ``stream``)."""
    events, data, size = [], [], 0
    for line in stream.split(b"\n")[:-1]:
        line = line.removesuffix(b"\r")
        if not line:
            if data and size <= max_line:
                try:
                    event = json.loads(b"\n".join(data))
                except ValueError:
                    event = None
                if type(event) is dict:
                    events.append(event)
            data, size = [], 0
        elif line.startswith(b"data:"):
            value = line[5:].removeprefix(b" ")
            data.append(value)
            size += len(value) + 1
    return events


_LINES = st.sampled_from(
    [
        b'data: {"type":"a","properties":{}}',
        b'data:{"type":"b"}',
        b'data: {"type":',
        b'data: "c"}',
        b"data: [1]",
        b"data: not json",
        b": comment",
        b"event: x",
        b"",
        b"data: " + b'{"type":"' + b"d" * 80 + b'"}',
    ]
)


class SSEStreamTests(SynchronousTestCase):
    """Any stream, cut anywhere: the events its lines mean, read whole or line by line."""

    @settings(max_examples=300, deadline=None)
    @given(
        lines=st.lists(_LINES, max_size=20),
        ends=st.lists(st.sampled_from([b"\n", b"\r\n"]), min_size=20, max_size=20),
        cuts=st.lists(st.integers(0, 2000), max_size=6),
    )
    def test_events_whatever_the_chunks(self, lines, ends, cuts):
        stream = b"".join(line + end for line, end in zip(lines, ends, strict=False))
        events = []
        parser = SSEParser(events.append, max_line=64)
        start = 0
        for cut in sorted({min(c, len(stream)) for c in cuts} | {len(stream)}):
            parser.feed(stream[start:cut])
            start = cut
        self.assertEqual(events, _reference(stream, 64))
