"""
Hostile frames over real loopback WebSockets to a real in-process gateway.

hypothesis generates the frames up front, derandomized (the same frames on every run, so a
failure reproduces), and they are sent many to a connection: TRAPSANDBOX_FUZZ_FRAMES of them
(``make fuzz`` sends 100,000; ``make test`` the default below).  Each connection ends with
one generated ending: a close from the client or a message the gateway must refuse with a
close frame (invalid UTF-8, over 1 MiB, a protocol violation, an invalid close frame).

What must hold, checked by an oracle independent of the gateway's code:

- every answerable request (a text message that is a JSON object, as RFC 8259 and the
  gateway's limits read it -- nesting at most 1024 deep, numbers that fit a double, no lone
  surrogates -- with event computer_request, a messageId of 1 to 128 characters and a type
  of 1 to 64) gets exactly one gateway_response with that messageId and type; nothing else
  is answered (binary frames included);
- the connection stays open through every other frame: a probe_gateway after the batch is
  answered on it; the gateway never drops a connection without a close frame, and the
  endings are answered with the right close code;
- nothing is logged as an error (no ``log_failure`` events, nothing at error or critical).
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import sys
from collections import Counter

import attrs
import orjson
import treq
from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from twisted.internet import endpoints
from twisted.internet.defer import Deferred
from twisted.trial.unittest import TestCase
from twisted.web.client import HTTPConnectionPool

from tests.harness.logcapture import LogCapture
from tests.harness.servers import Opencode, serve
from tests.harness.support import (
    both_modes,
    bounded,
    connect,
    reactor,
    start_gateway,
    unbatch_timers,
)
from trapsandbox import limits

BATCH = 100  # frames sent on one connection
MAX = limits.MAX_INBOUND_BYTES
MAX_DEPTH = 1024  # orjson's nesting limit, which the gateway's parser inherits
PASSWORD = "fuzz-sesame"

# Close codes a peer may send (RFC 6455 7.4, as Autobahn reads it).
VALID_CLOSE_CODES = [1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011]
# 1012-1014 are registered later than RFC 6455; Autobahn refuses them. Leave them out.
INVALID_CLOSE_CODES = st.one_of(
    st.sampled_from([0, 1, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000, 65535]),
    st.integers(0, 999),
    st.integers(1016, 2999),
    st.integers(5000, 65535),
)


# -- The oracle ------------------------------------------------------------------------------


def _reject(token):
    raise ValueError(f"not a JSON number: {token}")


def _finite(token: str) -> float:
    # Integers and decimals the gateway reads as doubles; beyond a double's range it refuses.
    value = float(token)
    if math.isinf(value):
        raise ValueError("number out of range")
    return value


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)


def _depth(text: str) -> int:
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return 0
    depth = deepest = 0
    for char in _STRINGS.sub("", text):
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _has_surrogate(value) -> bool:
    stack = [value]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(value, dict):
            stack.extend(value)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


def parse(data: bytes):
    """The JSON value of a text message, or a ValueError: what any compliant reader would do."""
    text = data.decode("utf-8")
    if _depth(text) > MAX_DEPTH:
        raise ValueError("nested too deep")
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * MAX_DEPTH))
    try:
        value = json.loads(text, parse_constant=_reject, parse_float=_finite, parse_int=_finite)
    finally:
        sys.setrecursionlimit(limit)
    if _has_surrogate(value):
        raise ValueError("lone surrogate")
    return value


def _usable(value, limit: int) -> bool:
    return type(value) is str and 0 < len(value) <= limit


def answer_key(data: bytes) -> tuple[str, str] | None:
    """(messageId, type) of the answer a text message must get, or None: no answer."""
    try:
        obj = parse(data)
    except ValueError:
        return None
    if type(obj) is not dict or obj.get("event") != "computer_request":
        return None
    message_id, kind = obj.get("messageId"), obj.get("type")
    if _usable(message_id, limits.MAX_ID_LENGTH) and _usable(kind, limits.MAX_TYPE_LENGTH):
        return (message_id, kind)
    return None


# -- Generation ------------------------------------------------------------------------------


@attrs.frozen
class Raw:
    """JSON text put into a message as is."""

    text: str


def _string(value: str, ascii_only: bool) -> str:
    # A lone surrogate can only travel as an escape (raw it is invalid UTF-8: an ending).
    return json.dumps(value, ensure_ascii=ascii_only or _has_surrogate(value))


def dump(value, ascii_only: bool = False) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        items = (f"{_string(k, ascii_only)}:{dump(v, ascii_only)}" for k, v in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dump(v, ascii_only) for v in value) + "]"
    if isinstance(value, str):
        return _string(value, ascii_only)
    return json.dumps(value)  # None, bools, ints of any size, floats (NaN, Infinity too)


@attrs.frozen
class Frame:
    """One thing a computer sends that must leave the connection open."""

    kind: str  # text, binary, ping, pong
    data: bytes
    fragment: int | None = None  # send as fragments of this size

    def send(self, computer: WebSocketClientProtocol) -> None:
        if self.kind == "ping":
            computer.sendPing(self.data)
        elif self.kind == "pong":
            computer.sendPong(self.data)
        else:
            computer.sendMessage(
                self.data, isBinary=self.kind == "binary", fragmentSize=self.fragment
            )


@attrs.frozen
class Ending:
    """The last thing sent on a connection, and the close codes the gateway may answer."""

    what: str
    codes: tuple[int, ...]
    kind: str = attrs.field(default="", kw_only=True)  # which generator branch made it
    data: bytes = b""
    opcode: int | None = None  # a raw frame
    fin: bool = True
    rsv: int = 0
    masked: bool = True
    prefix: tuple[tuple[int, bytes, bool], ...] = ()  # raw frames sent before it
    fragment: int | None = None

    def send(self, computer: WebSocketClientProtocol) -> None:
        if self.what == "close":  # a well-behaved close, through the library
            computer.sendClose(self.codes[-1])
            return
        if self.opcode is None:
            computer.sendMessage(
                self.data, isBinary=self.what == "binary", fragmentSize=self.fragment
            )
            return
        for opcode, payload, fin in self.prefix:
            computer.sendFrame(opcode, payload, fin=fin)
        computer.maskClientFrames = self.masked
        computer.sendFrame(self.opcode, self.data, fin=self.fin, rsv=self.rsv)
        computer.maskClientFrames = True


def weighted(*pairs):
    """One of the strategies, each ``weight`` times as likely (one_of ignores repeats)."""
    choices = [strategy for weight, strategy in pairs for _ in range(weight)]
    return st.sampled_from(choices).flatmap(lambda strategy: strategy)


CHARS = st.characters(codec="utf-8")  # no surrogates
ANY_CHARS = st.characters(exclude_categories=())  # lone surrogates too
CLEAN_TEXT = st.text(CHARS, max_size=12)
TEXT = weighted((3, CLEAN_TEXT), (1, st.text(ANY_CHARS, max_size=12)))


def sized(chars, low: int, high: int):
    """``low`` to ``high`` characters repeating a few drawn ones (a draw per character is slow)."""
    return st.builds(
        lambda base, n: (base * (n // len(base) + 1))[:n],
        st.text(chars, min_size=1, max_size=6),
        st.integers(low, high),
    )


def _deep(n: int, brackets: str) -> Raw:
    if brackets == "[":
        return Raw("[" * n + "]" * n)
    return Raw('{"a":' * n + "0" + "}" * n)


DEPTHS = st.one_of(st.integers(MAX_DEPTH - 8, MAX_DEPTH + 8), st.integers(1, 50_000))
RAW = st.one_of(
    st.builds(_deep, DEPTHS, st.sampled_from("[{")),
    st.integers(300, 5000).map(lambda n: Raw("9" * n)),  # hundreds of digits
    st.integers(300, 330).map(lambda n: Raw("-1" + "0" * n + ".5")),  # around a double's limit
    st.sampled_from(
        [
            "1e400",
            "-1e400",
            "1E+999",
            "1.5e-400",
            "-0",
            "1e308",
            "NaN",
            "Infinity",
            "-Infinity",
            '"\\ud800"',
            '"\\udfff"',
            '"a\\ud800b"',
            '"\\udc00\\ud800"',
            '"\\ud83d\\ude00"',
            '"\\u0000"',
            '"\\ufeff"',
        ]
    ).map(Raw),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(10**400), 10**400),
    st.floats(),
    TEXT,
    RAW,
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=5,
)
CLEAN_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63), st.floats(), CLEAN_TEXT),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(CLEAN_TEXT, inner, max_size=4)
    ),
    max_leaves=5,
)


def ids(limit: int):
    return weighted(
        (6, sized(CHARS, 1, limit)),
        (2, sized(CHARS, limit - 1, limit + 1)),  # the bound
        (1, sized(ANY_CHARS, 1, limit)),
        (1, st.just("")),
        (1, VALUES),
    )


TYPES = weighted(
    (
        4,
        st.sampled_from(
            ["probe_gateway", "health", "hello", "ping", "teleport", "PROBE_GATEWAY", "probe"]
        ),
    ),
    (3, ids(limits.MAX_TYPE_LENGTH)),
)
EVENTS = weighted(
    (6, st.just("computer_request")),
    (
        2,
        st.sampled_from(
            ["computer_response", "gateway_request", "gateway_response", "", "computer_request "]
        ),
    ),
    (1, VALUES),
)
PAYLOADS = weighted(
    (4, st.dictionaries(CLEAN_TEXT, CLEAN_VALUES, max_size=4)),
    (1, st.builds(lambda raw: {"deep": raw}, RAW)),
    (1, VALUES),
)
MESSAGE_IDS = ids(limits.MAX_ID_LENGTH)
REQUEST_FIELDS = [  # (key, its values, how often it is there in ten)
    ("event", EVENTS, 9),
    ("traposSenderId", weighted((4, st.just("7:")), (1, MESSAGE_IDS)), 8),
    ("messageId", MESSAGE_IDS, 9),
    ("type", TYPES, 9),
    ("payload", PAYLOADS, 6),
    ("ok", VALUES, 2),
    ("error", VALUES, 2),
]
PRESENT = st.integers(0, 9)
EXTRAS = st.dictionaries(CLEAN_TEXT, CLEAN_VALUES, max_size=2)


@st.composite
def requests(draw):
    """A frame-like object: the protocol's keys, each present or not, with odd values."""
    frame = {}
    for key, strategy, in_ten in REQUEST_FIELDS:
        if draw(PRESENT) < in_ten:
            frame[key] = draw(strategy)
    frame.update(draw(EXTRAS))
    return frame


@st.composite
def big_requests(draw):
    """A request with one string (or key) as long as the 1 MiB limit allows."""
    frame = {
        "event": "computer_request",
        "traposSenderId": "7:",
        "messageId": draw(MESSAGE_IDS),
        "type": draw(TYPES),
        "payload": {},
    }
    where = draw(st.sampled_from(["messageId", "type", "traposSenderId", "pad", "key", "event"]))
    char = draw(CHARS)
    ascii_only = draw(st.booleans())
    unit = len(_string(char, ascii_only).encode("utf-8")) - 2
    overhead = len(dump({**frame, "payload": {"pad": ""}}, ascii_only).encode("utf-8")) + 8
    longest = (MAX - overhead) // unit
    n = draw(
        weighted(
            (5, st.integers(0, 19).map(lambda k: min(2**k, longest))),
            (1, st.integers(longest - 16, longest)),
        )
    )
    text = char * n
    if where == "pad":
        frame["payload"] = {"pad": text}
    elif where == "key":
        frame["payload"] = {text: 1}
    else:
        frame[where] = text
    data = dump(frame, ascii_only).encode("utf-8")
    assert len(data) <= MAX, len(data)
    return Frame("text", data)


def _text_frame(value, ascii_only: bool) -> Frame:
    return Frame("text", dump(value, ascii_only).encode("utf-8"))


def _truncated(value, ascii_only: bool, cut: int) -> Frame:
    text = dump(value, ascii_only)
    return Frame("text", text[: cut % max(len(text), 1)].encode("utf-8"))


PLAUSIBLE = st.fixed_dictionaries(
    {
        "event": st.just("computer_request"),
        "traposSenderId": st.just("7:"),
        "messageId": sized(CHARS, 1, limits.MAX_ID_LENGTH),
        "type": TYPES,
    },
    optional={"payload": PAYLOADS, "extra": CLEAN_VALUES},
)

FRAMES_STRATEGY = weighted(
    (16, st.builds(_text_frame, requests(), st.booleans())),
    (12, st.builds(_text_frame, PLAUSIBLE, st.booleans())),
    (4, st.builds(_text_frame, VALUES, st.booleans())),  # non-object JSON, random objects
    (4, st.builds(lambda raw: Frame("text", raw.text.encode("utf-8")), RAW)),
    (4, st.builds(_truncated, requests(), st.booleans(), st.integers(0, 10_000))),
    (
        1,
        st.text(ANY_CHARS.filter(lambda c: not _has_surrogate(c)), max_size=200).map(
            lambda t: Frame("text", t.encode("utf-8"))
        ),
    ),
    (2, st.binary(max_size=2000).map(lambda b: Frame("binary", b))),
    (2, st.builds(lambda v: Frame("binary", dump(v).encode("utf-8")), requests())),
    (
        1,
        st.builds(
            lambda f, kind, size: Frame(kind, f.data, size),
            st.builds(_text_frame, requests(), st.booleans()).filter(lambda f: len(f.data) <= 4096),
            st.sampled_from(["text", "binary"]),
            st.integers(1, 4096),
        ),
    ),
    (2, st.builds(Frame, st.sampled_from(["ping", "pong"]), st.binary(max_size=125))),
    (1, big_requests()),  # rare: each is up to 1 MiB
)

BAD_UTF8 = [
    b"\xff",
    b"\xfe",
    b"\x80",
    b"\xc0\x80",  # overlong NUL
    b"\xed\xa0\x80",  # an encoded surrogate
    b"\xf4\x90\x80\x80",  # beyond U+10FFFF
]


ENDING_KINDS = [
    "utf8",
    "utf8-end",
    "surrogate-json",
    "close-code",
    "close-short",
    "close-reason",
    "close-valid",
    "close",
    "oversize",
    "opcode",
    "rsv",
    "continuation",
    "big-ping",
    "fragmented-ping",
    "unmasked",
    "interleaved",
]
# make test: one connection for each ending (generating costs ~2 ms a frame, in hypothesis,
# and each test runs twice: --plain too).
FRAMES = int(os.environ.get("TRAPSANDBOX_FUZZ_FRAMES", str(len(ENDING_KINDS) * BATCH)))


def endings(kind: str):
    return st.composite(lambda draw: attrs.evolve(_ending(draw, kind), kind=kind))()


def generate_endings(count: int) -> list[Ending]:
    """``count`` endings, every kind in turn."""
    kinds = list(ENDING_KINDS)
    per_kind = {kind: generate(endings(kind), -(-count // len(kinds)), 4) for kind in kinds}
    return [per_kind[kinds[n % len(kinds)]][n // len(kinds)] for n in range(count)]


def _ending(draw, kind: str) -> Ending:
    text = draw(st.text(CHARS, max_size=40)).encode("utf-8")
    if kind == "utf8":
        bad = draw(st.sampled_from(BAD_UTF8))
        fragment = draw(st.one_of(st.none(), st.integers(1, 16)))
        return Ending("text", (1007,), text + bad + text, fragment=fragment)
    if kind == "utf8-end":  # a sequence cut short at the end of the message
        return Ending("text", (1007,), text + draw(st.sampled_from([b"\xe2\x82", b"\xf0\x9f"])))
    if kind == "surrogate-json":  # a request with a raw (not escaped) lone surrogate
        raw = json.dumps({"event": "computer_request", "messageId": "\ud800", "type": "x"})
        data = raw.encode("utf-8").replace(b"\\ud800", "\ud800".encode("utf-8", "surrogatepass"))
        return Ending("text", (1007,), data)
    if kind == "close-code":
        code = draw(INVALID_CLOSE_CODES)
        return Ending("raw", (1002,), struct.pack("!H", code) + text, opcode=8)
    if kind == "close-short":
        return Ending("raw", (1002,), draw(st.binary(min_size=1, max_size=1)), opcode=8)
    if kind == "close-reason":
        code = draw(st.sampled_from(VALID_CLOSE_CODES))
        bad = draw(st.sampled_from(BAD_UTF8))
        return Ending("raw", (1007,), struct.pack("!H", code) + bad, opcode=8)
    if kind == "close-valid":  # a raw close with a valid code: the gateway answers 1000
        code = draw(st.one_of(st.sampled_from(VALID_CLOSE_CODES), st.integers(3000, 4999)))
        return Ending("raw", (1000, code), struct.pack("!H", code) + text, opcode=8)
    if kind == "close":
        return Ending("close", (1000,))
    if kind == "oversize":
        size = MAX + draw(st.integers(1, 64 * 1024))
        binary = draw(st.booleans())
        fragment = draw(st.one_of(st.none(), st.integers(64 * 1024, MAX)))
        return Ending("binary" if binary else "text", (1009,), b"x" * size, fragment=fragment)
    if kind == "opcode":
        opcode = draw(st.sampled_from([3, 4, 5, 6, 7, 11, 12, 13, 14, 15]))
        return Ending("raw", (1002,), text, opcode=opcode)
    if kind == "rsv":
        return Ending("raw", (1002,), text, opcode=1, rsv=draw(st.integers(1, 7)))
    if kind == "continuation":  # a continuation frame with no message started
        return Ending("raw", (1002,), text, opcode=0)
    if kind == "big-ping":
        return Ending("raw", (1002,), b"p" * draw(st.integers(126, 1000)), opcode=9)
    if kind == "fragmented-ping":
        return Ending("raw", (1002,), text[:100], opcode=9, fin=False)
    if kind == "unmasked":
        return Ending("raw", (1002,), text, opcode=1, masked=False)
    # "interleaved": a new message starts while a fragmented one is unfinished
    return Ending("raw", (1002,), text, opcode=1, prefix=((1, b"{", False),))


def generate(strategy, count: int, per_example: int = 16) -> list:
    """``count`` examples of ``strategy``, the same ones on every run."""
    found: list = []

    @settings(
        max_examples=-(-count // per_example),
        database=None,
        derandomize=True,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    # Many to an example: hypothesis's cost per example is high.
    @given(st.lists(strategy, min_size=per_example, max_size=per_example))
    def collect(examples):
        found.extend(examples)

    collect()
    return found[:count]


# -- The computer ----------------------------------------------------------------------------


class FuzzComputer(WebSocketClientProtocol):
    """Counts the gateway's answers by (messageId, type); records how the connection ended."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: Counter = Counter()
        self.by_id: dict[str, dict] = {}
        self.unexpected: list = []
        self.received = 0
        self.closed: Deferred = Deferred()
        self.ended: tuple | None = None
        self._waiting: tuple[int, Deferred] | None = None

    def onOpen(self) -> None:
        self.factory.opened.callback(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.received += 1
        frame = orjson.loads(payload) if not isBinary else None
        if type(frame) is not dict or frame.get("event") != "gateway_response":
            self.unexpected.append(payload[:300])
        else:
            self.answers[(frame.get("messageId"), frame.get("type"))] += 1
            self.by_id[frame.get("messageId")] = frame
        if self._waiting is not None and self.received >= self._waiting[0]:
            d, self._waiting = self._waiting[1], None
            d.callback(self.received)

    def onClose(self, wasClean: bool, code, reason) -> None:
        self.ended = (wasClean, code, reason)
        if not self.factory.opened.called:
            self.factory.opened.errback(ConnectionError(f"closed: {code} {reason}"))
        if self._waiting is not None:
            d, self._waiting = self._waiting[1], None
            d.errback(ConnectionError(f"closed while waiting for answers: {code} {reason}"))
        self.closed.callback(self.ended)

    def wait_received(self, count: int, seconds: float = 30) -> Deferred:
        """Fires once ``count`` messages in all have arrived."""
        if self.received >= count:
            d = Deferred()
            d.callback(self.received)
            return d
        if self.ended is not None:
            raise AssertionError(f"closed: {self.ended}; received {self.received} of {count}")
        d = Deferred()
        self._waiting = (count, d)
        return bounded(d, seconds)

    async def ask(self, message_id: str, type: str, payload=None) -> dict:
        """Send one request and wait for its answer (all earlier answers must be in)."""
        self.sendMessage(
            orjson.dumps(
                {
                    "event": "computer_request",
                    "traposSenderId": "7:",
                    "messageId": message_id,
                    "type": type,
                    "payload": payload or {},
                }
            )
        )
        await self.wait_received(self.received + 1)
        return self.by_id[message_id]


async def fuzz_connect(testcase, port: int) -> FuzzComputer:
    factory = WebSocketClientFactory(f"ws://127.0.0.1:{port}/gateway?fuzz=1")
    factory.protocol = FuzzComputer
    factory.opened = Deferred()
    unbatch_timers(factory)
    factory.setProtocolOptions(
        maxMessagePayloadSize=0,
        maxFramePayloadSize=0,
        closeHandshakeTimeout=1,
        serverConnectionDropTimeout=1,
    )
    endpoint = endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", port)
    await bounded(endpoint.connect(factory))
    computer = await bounded(factory.opened)

    async def close():
        if not computer.closed.called:
            computer.dropConnection(abort=True)
            await bounded(computer.closed)

    testcase.addCleanup(lambda: Deferred.fromCoroutine(close()))
    return computer


# -- The tests -------------------------------------------------------------------------------


class FuzzTestCase(TestCase):
    def setUp(self):
        self.log = LogCapture(self)
        # A healthy opencode that answers at once: probes are answered later than other
        # requests, but quickly.
        self.gateway = start_gateway(self, password=PASSWORD, opencode_url=serve(self, Opencode()))
        # A batch of unauthenticated frames may take longer than the hello timeout.
        self.gateway.factory.hello_timeout = 3600

    def assertNoErrorsLogged(self):
        errors = self.log.errors()
        self.assertEqual(errors, [], "errors were logged:\n" + "\n".join(errors))

    async def ready(self, name="1:fuzz") -> FuzzComputer:
        computer = await fuzz_connect(self, self.gateway.port)
        reply = await computer.ask("hello-0", "hello", {"traposId": name, "secret": PASSWORD})
        self.assertTrue(reply["ok"], reply)
        return computer

    async def assertProbeWorks(self, computer: FuzzComputer, message_id: str):
        reply = await computer.ask(message_id, "probe_gateway")
        payload = reply["payload"]
        self.assertEqual((reply["ok"], payload["sandboxOk"], payload["opencodeOk"]), (True,) * 3)

    async def assertEnds(self, computer: FuzzComputer, ending: Ending, clean: bool = True):
        ending.send(computer)
        was_clean, code, reason = await bounded(computer.closed)
        self.assertIn(code, ending.codes, f"{ending!r} ended with {code} {reason!r}")
        if clean:
            self.assertTrue(was_clean, f"{ending!r}: the gateway dropped the connection: {reason}")


class GeneratedFramesTests(FuzzTestCase):
    # make fuzz: 100,000 frames took 243 s here (210 s of it generating them).
    timeout = max(120, FRAMES // 150)

    async def test_generated_frames(self):
        started = reactor().seconds()
        frames = generate(FRAMES_STRATEGY, FRAMES)
        batches = [frames[i : i + BATCH] for i in range(0, len(frames), BATCH)]
        ends = generate_endings(len(batches))
        generated = reactor().seconds()
        self.assertGreaterEqual(len(frames), FRAMES * 0.95)
        totals = Counter()
        for n, batch in enumerate(batches):
            ending = ends[n]
            authenticated = n % 3 != 2
            if authenticated:
                computer = await self.ready(f"{n}:fuzz")
                received = 1
            else:
                computer = await fuzz_connect(self, self.gateway.port)
                received = 0
            expected = Counter()
            for frame in batch:
                key = answer_key(frame.data) if frame.kind == "text" else None
                if key is not None and not authenticated and key[1] == "hello":
                    continue  # a hello there would authenticate (or close) the connection
                frame.send(computer)
                totals[frame.kind] += 1
                totals["bytes"] += len(frame.data)
                if key is not None:
                    expected[key] += 1
            totals["answerable"] += sum(expected.values())
            try:
                await computer.wait_received(received + sum(expected.values()))
            except Exception as error:
                self.fail(f"batch {n}: {error}; missing {expected - computer.answers}")
            if authenticated:
                expected[("hello-0", "hello")] += 1
            self.assertEqual(computer.unexpected, [], f"batch {n}")
            self.assertEqual(
                computer.answers,
                expected,
                f"batch {n}: unanswered {expected - computer.answers}, "
                f"extra {computer.answers - expected}",
            )
            # The connection is still open and still works.
            if authenticated:
                await self.assertProbeWorks(computer, f"after-{n}")
            else:
                reply = await computer.ask(f"after-{n}", "probe_gateway")
                self.assertEqual(reply["error"]["code"], "not_authenticated")
                reply = await computer.ask(
                    "hello-late", "hello", {"traposId": f"{n}:late", "secret": PASSWORD}
                )
                self.assertTrue(reply["ok"], reply)
                await self.assertProbeWorks(computer, f"probe-late-{n}")
            await self.assertEnds(computer, ending)
            totals[f"ending {ending.kind}"] += 1
        # A fresh connection works too.
        computer = await self.ready("0:fresh")
        await self.assertProbeWorks(computer, "fresh")
        self.assertNoErrorsLogged()
        elapsed = reactor().seconds() - started
        # For docs/reliability.md; visible with pytest -s.
        print(
            f"\nfuzz: {sum(len(b) for b in batches)} frames ({dict(totals)}) "
            f"on {len(batches)} connections: generated in {generated - started:.1f} s, "
            f"sent and checked in {elapsed - (generated - started):.1f} s"
        )


class NamedHostileFramesTests(FuzzTestCase):
    """The hostile frames issue 6 names, one by one, with exact expectations."""

    async def assertIgnored(self, computer: FuzzComputer, *data: bytes, binary=False):
        before = computer.received
        for each in data:
            computer.sendMessage(each, isBinary=binary)
        await self.assertProbeWorks(computer, f"probe-{before}")
        self.assertEqual(computer.received, before + 1, "something was answered")
        self.assertEqual(computer.unexpected, [])

    async def test_nesting_beyond_the_parser_limit_is_ignored(self):
        computer = await self.ready()
        request = b'{"event":"computer_request","traposSenderId":"7:","messageId":"m","type":"x",'
        await self.assertIgnored(
            computer,
            b"[" * 100_000 + b"]" * 100_000,
            b'{"a":' * 5000 + b"1" + b"}" * 5000,
            request + b'"payload":' + b"[" * 1024 + b"]" * 1024 + b"}",
        )
        # Just inside the limit it is a request like any other.
        computer.sendMessage(request + b'"payload":' + b"[" * 1022 + b"]" * 1022 + b"}")
        await computer.wait_received(computer.received + 1)
        self.assertEqual(computer.by_id["m"]["error"]["code"], "unknown_type")
        self.assertNoErrorsLogged()

    async def test_enormous_numbers_are_ignored(self):
        computer = await self.ready()
        template = '{"event":"computer_request","traposSenderId":"7:","messageId":%s,"type":"x"}'
        await self.assertIgnored(
            computer,
            (template % "1e400").encode(),
            (template % ("9" * 400)).encode(),
            (template.replace('"x"', "-1e999") % '"m1"').encode(),
            b"1" + b"0" * 5000,
        )
        # A number that fits is just not a usable messageId: no answer either.
        await self.assertIgnored(computer, (template % "1e300").encode())
        self.assertNoErrorsLogged()

    async def test_lone_surrogates_are_ignored(self):
        computer = await self.ready()
        template = '{"event":"computer_request","traposSenderId":"7:","messageId":"%s","type":"x"}'
        await self.assertIgnored(
            computer,
            (template % "\\ud800").encode(),
            (template % "a\\udfffb").encode(),
            (template.replace('"x"', '"\\udc00"') % "m2").encode(),
        )
        # A pair is one character: answered.
        computer.sendMessage((template % "\\ud83d\\ude00").encode())
        await computer.wait_received(computer.received + 1)
        self.assertEqual(computer.by_id["\U0001f600"]["error"]["code"], "unknown_type")
        self.assertNoErrorsLogged()

    async def test_binary_frames_are_ignored(self):
        computer = await self.ready()
        request = orjson.dumps(
            {"event": "computer_request", "traposSenderId": "7:", "messageId": "b", "type": "x"}
        )
        await self.assertIgnored(computer, b"\x00\xff" * 100, request, b"", binary=True)
        self.assertNoErrorsLogged()

    async def test_invalid_utf8_closes_1007(self):
        for bad in BAD_UTF8:
            computer = await self.ready()
            await self.assertEnds(computer, Ending("text", (1007,), b'{"event":"' + bad + b'"}'))
        self.assertNoErrorsLogged()

    async def test_invalid_close_codes_do_not_hurt_the_gateway(self):
        for code in (0, 999, 1004, 1005, 1006, 1015, 2999, 5000, 65535):
            computer = await self.ready()
            await self.assertEnds(
                computer,
                Ending("raw", (1002, 1006), struct.pack("!H", code), opcode=8),
                clean=False,
            )
        computer = await fuzz_connect(self, self.gateway.port)  # before hello too
        await self.assertEnds(
            computer, Ending("raw", (1002, 1006), struct.pack("!H", 999), opcode=8), clean=False
        )
        self.assertNoErrorsLogged()
        await self.assertProbeWorks(await self.ready(), "after")
        self.assertEqual(len(self.gateway.registry), 1)

    async def test_invalid_close_codes_are_answered_1002(self):
        for code in (0, 999, 1004, 1005, 1006, 1015, 2999, 5000, 65535):
            computer = await self.ready()
            await self.assertEnds(
                computer, Ending("raw", (1002,), struct.pack("!H", code), opcode=8)
            )

    async def test_invalid_close_reason_is_answered_1007(self):
        for bad in BAD_UTF8:
            computer = await self.ready()
            await self.assertEnds(
                computer, Ending("raw", (1007,), struct.pack("!H", 1000) + bad, opcode=8)
            )

    async def test_one_byte_close_body_is_answered_1002(self):
        computer = await self.ready()
        await self.assertEnds(computer, Ending("raw", (1002,), b"\x03", opcode=8))

    async def test_oversized_is_closed_1009_even_fragmented(self):
        computer = await self.ready()
        await self.assertEnds(
            computer, Ending("text", (1009,), b" " * (MAX + 1), fragment=64 * 1024)
        )
        self.assertNoErrorsLogged()


class UnserialisableAnswerTests(TestCase):
    """
    A computer's answer the gateway can read but not write again: nested deeper than orjson
    writes (254), relayed to an operator through POST /computers/<id>/requests.
    """

    async def test_deep_answer_is_a_clean_error(self):
        log = LogCapture(self)
        gateway = start_gateway(self, password=PASSWORD)
        computer = await connect(self, gateway.port)
        self.assertTrue((await computer.hello(PASSWORD))["ok"])
        pool = HTTPConnectionPool(reactor(), persistent=False)
        posted = treq.post(
            f"http://127.0.0.1:{gateway.port}/computers/7%3A/requests",
            json={"type": "ping"},
            pool=pool,
        )
        request = await computer.next_message()
        computer.send(
            b'{"event":"computer_response","traposSenderId":"7:","messageId":"'
            + request["messageId"].encode()
            + b'","type":"ping","ok":true,"payload":{"deep":'
            + b"[" * 300
            + b"]" * 300
            + b"}}"
        )
        response = await bounded(posted)
        body = orjson.loads(await bounded(treq.content(response)))
        self.flushLoggedErrors()  # counted by ``errors``; trial would count them again
        self.assertEqual(log.errors(), [])
        self.assertIn(response.code, (200, 502))
        self.assertIsInstance(body, dict)


both_modes(
    globals(), "GeneratedFramesTests", "NamedHostileFramesTests", "UnserialisableAnswerTests"
)
