"""
The SSE parser (``opencode.sse``): events split across chunks, fields and
comments, malformed data, overlong lines.
"""

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
