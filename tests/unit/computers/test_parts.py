"""File parts on the wire (``computers.parts``): how a part is written for each client."""

import base64

import orjson
from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from trapsandbox.computers import parts, wire
from trapsandbox.errors import GatewayError
from trapsandbox.web.operator import parse_request

NEW = frozenset({wire.BINARY_PARTS, wire.WRITE_FILES})  # a client taking binary parts
OLD = frozenset()  # one that does not
WRITE = {"path": "/a\nb", "encoding": "base64", "part": {"offset": 0, "final": True}}


class EncodeTests(SynchronousTestCase):
    @given(raw=st.binary(max_size=4096), as_text=st.booleans())
    def test_a_write_to_a_client_taking_binary_parts(self, raw, as_text):
        # Content given as bytes, or as base64 text (an operator's, or relayed): the same part.
        content = base64.b64encode(raw).decode() if as_text else raw
        data = parts.encode_request("7:", "m-1", "write_file", {**WRITE, "content": content}, NEW)
        self.assertIs(type(data), parts.BinaryFrame)
        header, newline, rest = data.partition(b"\n")
        self.assertEqual(rest, raw)
        frame = orjson.loads(header)  # (the path's own newline is escaped in the JSON)
        self.assertEqual(frame["payload"], {**WRITE, "encoding": "binary"})
        self.assertEqual(frame["messageId"], "m-1")

    def test_a_write_to_a_client_without_them_is_base64_text(self):
        data = parts.encode_request("7:", "m-1", "write_file", {**WRITE, "content": b"\xff"}, OLD)
        self.assertIs(type(data), bytes)
        self.assertEqual(orjson.loads(data)["payload"]["content"], "/w==")

    def test_content_that_is_not_base64_cannot_be_sent(self):
        with self.assertRaises(ValueError):
            parts.encode_request("7:", "m", "write_file", {**WRITE, "content": "no!"}, NEW)

    def test_a_read_asks_for_binary_only_of_a_client_that_gives_it(self):
        ask = {"path": "/a", "encoding": "binary"}
        to_old = orjson.loads(parts.encode_request("7:", "m", "read_file", ask, OLD))
        self.assertEqual(to_old["payload"]["encoding"], "base64")
        to_new = parts.encode_request("7:", "m", "read_file", ask, NEW)
        self.assertEqual(orjson.loads(to_new)["payload"]["encoding"], "binary")
        self.assertIs(type(to_new), bytes)  # a read's request is a text frame

    def test_a_batch_of_files_goes_only_as_binary(self):
        batch = {"encoding": "binary", "files": [{"path": "/a", "size": 2}], "content": b"ab"}
        data = parts.encode_request("7:", "m", "write_files", batch, NEW)
        self.assertEqual(data.partition(b"\n")[2], b"ab")
        for features in (OLD, frozenset({wire.BINARY_PARTS})):  # without write_files: refused
            with self.assertRaises(ValueError):
                parts.encode_request("7:", "m", "write_files", batch, features)

    def test_other_requests_are_as_wire_writes_them(self):
        for features in (OLD, NEW):
            self.assertEqual(
                parts.encode_request("7:", "m", "list_files", {"path": "/"}, features),
                wire.encode_request("7:", "m", "list_files", {"path": "/"}),
            )


class DecodeTests(SynchronousTestCase):
    def answer(self, **fields):
        frame = {
            "event": "computer_response",
            "traposSenderId": "7:",
            "messageId": "m-1",
            "type": "read_file",
            "ok": True,
            "payload": {"encoding": "binary", "sizeBytes": 3},
            **fields,
        }
        return orjson.dumps(frame)

    @given(raw=st.binary(max_size=4096))
    def test_an_answer_carries_its_bytes_as_content(self, raw):
        frame = parts.decode_response(self.answer() + b"\n" + raw)
        self.assertIsInstance(frame, wire.ComputerResponse)
        self.assertEqual(frame.payload, {"encoding": "binary", "sizeBytes": 3, "content": raw})

    def test_a_payload_that_is_not_an_object_is_read_as_empty(self):
        frame = parts.decode_response(self.answer(payload=[]) + b"\nab")
        self.assertEqual(frame.payload, {"content": b"ab"})

    @given(st.binary(max_size=256))
    def test_never_raises(self, data):
        parts.decode_response(data)

    def test_what_is_not_a_file_parts_answer(self):
        for message, reason in [
            (b"no header", "no header"),
            (b"{\n", "not JSON"),
            (self.answer(ok=False) + b"\n", "not a file part's answer"),
            (self.answer(partial=True) + b"\n", "not a file part's answer"),
        ]:
            frame = parts.decode_response(message)
            self.assertIsInstance(frame, wire.Invalid, repr(message))
            self.assertIn(reason, frame.reason)


class OperatorTests(SynchronousTestCase):
    def test_an_operator_request_cannot_ask_for_binary_content(self):
        for kind in ("read_file", "write_file", "write_files"):
            with self.assertRaises(GatewayError) as caught:
                parse_request({"type": kind, "payload": {"path": "/a", "encoding": "binary"}})
            self.assertEqual(caught.exception.code, "bad_request")
        self.assertEqual(
            parse_request({"type": "read_file", "payload": {"path": "/a"}})[0], "read_file"
        )
