"""The wire codec: decode never raises, and frames survive a round trip."""

import uuid

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from trapsandbox import errors, limits
from trapsandbox.computers import wire

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
ids = st.text(min_size=1, max_size=limits.MAX_ID_LENGTH)
types = st.text(min_size=1, max_size=limits.MAX_TYPE_LENGTH)
payloads = st.dictionaries(st.text(max_size=8), json_values, max_size=4)
wire_errors = st.builds(errors.Error, st.text(), st.text())
frames = st.one_of(
    st.builds(wire.ComputerRequest, ids, ids, types, payloads),
    st.builds(wire.GatewayRequest, ids, ids, types, payloads),
    st.builds(wire.ComputerResponse, ids, ids, types, st.just(True), payloads | st.none()),
    st.builds(wire.GatewayResponse, ids, ids, types, st.just(True), payloads | st.none()),
    st.builds(wire.ComputerResponse, ids, ids, types, st.just(False), st.none(), wire_errors),
    st.builds(wire.GatewayResponse, ids, ids, types, st.just(False), st.none(), wire_errors),
)
# Objects shaped like frames, with any values in their fields.
frame_like = st.fixed_dictionaries(
    {"event": st.sampled_from([*wire.EVENTS, "nope"]) | json_values},
    optional={
        key: json_values | st.text()
        for key in (
            "traposSenderId",
            "traposReceiverId",
            "messageId",
            "type",
            "ok",
            "payload",
            "error",
        )
    },
)


# Responses of every shape: mostly plain ones, with any extra or odd fields.
_odd = {
    "payload": payloads | json_values,
    "error": st.none() | st.fixed_dictionaries({"code": st.text(), "message": st.text()}),
    "partial": st.booleans() | st.none() | json_values,
    "extra": json_values,
}
plain_responses = st.fixed_dictionaries(
    {
        "event": st.just("computer_response"),
        "traposSenderId": ids,
        "messageId": ids,
        "type": types,
        "ok": st.booleans(),
    },
    optional=_odd,
)
response_like = st.fixed_dictionaries(
    {"event": st.just("computer_response")},
    optional={
        "traposSenderId": ids | json_values,
        "messageId": ids | json_values,
        "type": types | json_values,
        "ok": st.booleans() | json_values,
        **_odd,
        "error": _odd["error"] | json_values,
    },
)


def request(**fields):
    frame = {
        "event": "computer_request",
        "traposSenderId": "7:",
        "messageId": "m1",
        "type": "probe_gateway",
        "payload": {},
    }
    frame.update(fields)
    return orjson.dumps({k: v for k, v in frame.items() if v is not None})


class DecodeTests(SynchronousTestCase):
    def test_computer_request(self):
        frame = wire.decode(request(payload={"a": 1}))
        self.assertEqual(frame, wire.ComputerRequest("7:", "m1", "probe_gateway", {"a": 1}))

    def test_payload_coercion(self):
        """A missing, array or non-object payload reads as {}."""
        for payload in (None, [], [1, 2], "x", 3, True):
            frame = wire.decode(request(payload=payload))
            self.assertEqual(frame.payload, {}, payload)

    def test_response_with_error(self):
        frame = wire.decode(
            b'{"event":"computer_response","traposSenderId":"7:","messageId":"m",'
            b'"type":"ping","ok":false,"error":{"code":"x","message":"y"}}'
        )
        self.assertEqual(frame.error, errors.Error("x", "y"))
        self.assertFalse(frame.ok)

    def test_not_json(self):
        for data in (b"{", b"\xff\xfe", b"", b"nul"):
            frame = wire.decode(data)
            self.assertIsInstance(frame, wire.Invalid)
            self.assertFalse(frame.answerable)
            self.assertIn("not JSON", frame.reason)

    def test_not_an_object(self):
        self.assertIn("not a JSON object", wire.decode(b"[1]").reason)

    def test_unknown_event(self):
        frame = wire.decode(b'{"event":"hello","messageId":"m","type":"t"}')
        self.assertEqual(frame.reason, "unknown event")
        self.assertFalse(frame.answerable)

    def test_invalid_request_keeps_id_and_type(self):
        """An invalid request with a usable messageId and type can be answered."""
        frame = wire.decode(request(traposSenderId=7))
        self.assertTrue(frame.answerable)
        self.assertEqual((frame.message_id, frame.type), ("m1", "probe_gateway"))
        self.assertIn("traposSenderId", frame.reason)

    def test_strict_types(self):
        """No coercion of 3 to "3" nor of "no" to True."""
        self.assertIsInstance(wire.decode(request(messageId=3)), wire.Invalid)
        self.assertIsInstance(wire.decode(request(type="")), wire.Invalid)
        response = orjson.dumps(
            {
                "event": "computer_response",
                "traposSenderId": "7:",
                "messageId": "m",
                "type": "ping",
                "ok": "no",
            }
        )
        self.assertIn("ok", wire.decode(response).reason)

    def test_overlong_ids(self):
        frame = wire.decode(request(messageId="x" * (limits.MAX_ID_LENGTH + 1)))
        self.assertIsInstance(frame, wire.Invalid)
        self.assertIsNone(frame.message_id)

    def test_deep_nesting_is_rejected(self):
        frame = wire.decode(b"[" * 100_000 + b"]" * 100_000)
        self.assertIsInstance(frame, wire.Invalid)

    @given(json_values)
    def test_any_json_value(self, value):
        self.assertIsInstance(
            wire.decode(orjson.dumps(value)),
            (*wire.EVENTS.values(), wire.Invalid),
        )

    @given(frame_like)
    def test_any_frame_like_object(self, value):
        self.assertIsInstance(
            wire.decode(orjson.dumps(value)),
            (*wire.EVENTS.values(), wire.Invalid),
        )

    @given(st.binary())
    def test_any_bytes(self, data):
        self.assertIsInstance(wire.decode(data), (*wire.EVENTS.values(), wire.Invalid))


class EncodeTests(SynchronousTestCase):
    @given(frames)
    def test_round_trip(self, frame):
        self.assertEqual(wire.decode(wire.encode(frame)), frame)

    @given(ids, ids, types, payloads | st.none(), wire_errors | st.none())
    def test_encode_response_is_encode_of_the_frame(
        self, receiver, message_id, type, payload, error
    ):
        frame = wire.GatewayResponse(
            receiver, message_id, type, error is None, None if error else payload, error
        )
        self.assertEqual(
            wire.encode_response(receiver, message_id, type, payload, error), wire.encode(frame)
        )

    @given(ids, ids, st.text(max_size=limits.MAX_TYPE_LENGTH + 2), payloads | st.just([]))
    def test_encode_request_is_encode_of_the_frame(self, receiver, message_id, kind, payload):
        try:
            expected = wire.encode(wire.GatewayRequest(receiver, message_id, kind, payload))
        except ValueError:
            with self.assertRaises(ValueError):
                wire.encode_request(receiver, message_id, kind, payload)
            return
        self.assertEqual(wire.encode_request(receiver, message_id, kind, payload), expected)

    @settings(max_examples=300)
    @given(st.one_of(plain_responses, response_like))
    def test_the_direct_read_of_a_response_is_cattrs_read(self, obj):
        direct = wire.decode(orjson.dumps(obj))
        self.assertEqual(direct, wire.structure(obj, wire.ComputerResponse))

    def test_message_ids_are_uuid4_strings(self):
        ids = {wire.new_message_id() for _ in range(1000)}
        self.assertEqual(len(ids), 1000)
        for message_id in ids:
            parsed = uuid.UUID(message_id)
            self.assertEqual((parsed.version, parsed.variant), (4, uuid.RFC_4122))
            self.assertEqual(str(parsed), message_id)

    def test_camel_case_and_event_on_the_wire(self):
        data = orjson.loads(wire.encode(wire.GatewayRequest("7:", "m", "ping", {})))
        self.assertEqual(
            data,
            {
                "event": "gateway_request",
                "traposReceiverId": "7:",
                "messageId": "m",
                "type": "ping",
                "payload": {},
            },
        )

    def test_absent_payload_and_error_are_omitted(self):
        data = orjson.loads(wire.encode(wire.GatewayResponse("7:", "m", "x", True)))
        self.assertNotIn("payload", data)
        self.assertNotIn("error", data)

    def test_unencodable(self):
        with self.assertRaises(wire.EncodeError):
            wire.encode(wire.GatewayRequest("7:", "m", "x", {"n": 2**70}))


class HelloTests(SynchronousTestCase):
    def test_valid(self):
        hello = wire.decode_hello({"traposId": "7:base", "secret": "s", "version": "0.1.0"})
        self.assertEqual((hello.trapos_id, hello.secret, hello.version), ("7:base", "s", "0.1.0"))

    def test_trapos_ids(self):
        for good in ("0:", "7:", "12:a label", "3:" + "x" * 32):
            self.assertTrue(wire.is_trapos_id(good), good)
        for bad in ("", "7", ":x", "-1:", "01:", "x:y", "3:" + "x" * 33, "3:a\nb", 7, None):
            self.assertFalse(wire.is_trapos_id(bad), bad)

    def test_errors_name_the_field(self):
        for payload, field in (
            ({}, "traposId"),
            ({"traposId": "nope"}, "traposId"),
            ({"traposId": "1:", "secret": 5}, "secret"),
            ({"traposId": "1:", "capabilities": "ab"}, "capabilities"),
            ({"traposId": "1:", "version": "v" * 65}, "version"),
        ):
            with self.assertRaises(ValueError) as caught:
                wire.decode_hello(payload)
            self.assertIn(field, str(caught.exception))


class CutTests(SynchronousTestCase):
    @given(st.text(max_size=500), st.integers(min_value=1, max_value=300))
    def test_a_value_is_kept_whole_or_cut_to_the_limit_with_an_ellipsis(self, value, limit):
        text = wire.cut(value, limit)
        if len(value) <= limit:
            self.assertEqual(text, value)
        else:
            self.assertEqual(len(text), limit)
            self.assertEqual(text, value[: limit - 1] + "\u2026")

    def test_other_values_are_shown_as_their_repr(self):
        self.assertEqual(wire.cut(7), "7")
        self.assertEqual(len(wire.cut(list(range(10_000)))), wire.ECHO_LIMIT)
