"""Fakes for unit tests: a registry link, an in-memory computer connection, a fixed probe."""

import base64

import attrs
import orjson
from autobahn.websocket.protocol import WebSocketProtocol
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.defer import succeed

from tests.harness.support import response_frame
from trapsandbox import errors, limits
from trapsandbox.computers import parts, wire
from trapsandbox.computers.outbound import Outbound
from trapsandbox.computers.session import Session
from trapsandbox.errors import GatewayError


@attrs.define
class FakeLink:
    """A connection that records what is sent and closed."""

    sent: list = attrs.field(factory=list)
    closed: list = attrs.field(factory=list)
    open: bool = True

    def send_frame(self, data: bytes) -> None:
        if not self.open:
            raise GatewayError(errors.NOT_CONNECTED, "closed")
        self.sent.append(orjson.loads(data))

    def close(self, code: int, reason: str) -> None:
        self.closed.append((code, reason))
        self.open = False


class FakeUpgrade:
    """Autobahn's ``ConnectionRequest`` as ``onConnect`` reads it."""

    peer = "tcp4:10.0.0.7:50123"

    def __init__(self, peer=None, headers=None):
        if peer is not None:
            self.peer = peer
        # As Autobahn has them: lower-case names, repeated lines joined with ", ".
        self.headers = {"host": "gw.example:4444", **(headers or {})}


class FakeTransport:
    """Where the protocol registers its producer; its peer is the upgrade's."""

    def __init__(self, peer):
        self.producer = "the HTTP channel"
        kind, _, rest = peer.partition(":")
        host, _, port = rest.rpartition(":")
        if kind == "unix":
            self.peer = UNIXAddress(rest)
        else:
            self.peer = (IPv4Address if kind == "tcp4" else IPv6Address)("TCP", host, int(port))

    def getPeer(self):
        return self.peer

    def registerProducer(self, producer, streaming):
        assert self.producer is None and streaming
        self.producer = producer

    def unregisterProducer(self):
        self.producer = None


class Computer:
    """One in-memory connection to the gateway, seen from the computer."""

    def __init__(self, factory, trapos_id="7:", peer=None, headers=None):
        self.trapos_id = trapos_id
        self.sent = []
        self.closes = []
        self.protocol = protocol = factory.buildProtocol(None)
        protocol.sendMessage = self._record
        protocol.sendClose = self._close
        protocol.dropConnection = lambda abort=False: self.lost(1006)
        upgrade = FakeUpgrade(peer, headers)
        protocol.transport = FakeTransport(upgrade.peer)
        protocol.onConnect(upgrade)
        protocol.state = WebSocketProtocol.STATE_OPEN
        protocol.onOpen()
        self._ids = 0

    def _record(self, data, isBinary=False):
        if isBinary:  # a file part (``computers.parts``): its frame, then its bytes as ``raw``
            header, _, raw = data.partition(b"\n")
            self.sent.append({**orjson.loads(header), "raw": raw})
            return
        self.sent.append(orjson.loads(data))

    def _close(self, code=None, reason=None):
        self.closes.append((code, reason))
        self.protocol.state = WebSocketProtocol.STATE_CLOSING

    def lost(self, code=1000):
        self.protocol.state = WebSocketProtocol.STATE_CLOSED
        self.protocol.onClose(True, code, "")

    def receive(self, obj, binary=False):
        data = obj if isinstance(obj, bytes) else orjson.dumps(obj)
        self.protocol.onMessage(data, binary)

    def request(self, type, payload=None, **extra):
        self._ids += 1
        message_id = f"1700000000000-{self._ids}"
        frame = {
            "event": "computer_request",
            "traposSenderId": self.trapos_id,
            "messageId": message_id,
            "type": type,
        }
        if payload is not None:
            frame["payload"] = payload
        frame.update(extra)
        self.receive(frame)
        return message_id

    def respond(self, request, **fields):
        self.receive(response_frame(self.trapos_id, request, **fields))

    def hello(self, secret="sesame", **payload):
        payload = {"traposId": self.trapos_id, "secret": secret, **payload}
        self.request("hello", payload)
        return self.sent[-1]

    def last(self):
        return self.sent[-1]


class FixedProbe:
    def __init__(self, result):
        self.result = result

    def check(self):
        return succeed(self.result)


class _Files(dict):
    """Files by path: a test names one "/a" or "a" (the gateway sends "/a", canonical)."""

    def _key(self, key):
        for each in (key, "/" + key.lstrip("/"), key.lstrip("/")):
            if dict.__contains__(self, each):
                return each
        return key

    def __getitem__(self, key):
        return dict.__getitem__(self, self._key(key))

    def __setitem__(self, key, value):
        dict.__setitem__(self, self._key(key), value)

    def __contains__(self, key):
        return dict.__contains__(self, self._key(key))

    def get(self, key, default=None):
        return dict.get(self, self._key(key), default)

    def pop(self, key, *default):
        return dict.pop(self, self._key(key), *default)


class SandboxComputer:
    """
    A computer that answers the §9 requests in memory, as the Lua client does:
    files in ``files`` (parts go to a temp file moved into place on the last
    one), ``exec`` held in ``runs`` for the test to drive, the rest answered
    at once.  Attach it to a ``Session`` with ``link=SandboxComputer(...)``
    and ``attach(session)``.
    """

    def __init__(self, capabilities=("exec", "eval", "fs.read", "fs.write", "screen"), features=()):
        self.capabilities = frozenset(capabilities)
        # What its client announces in hello: ``wire.BINARY_PARTS`` for file parts as binary
        # messages (``raw`` in the request it records; a read asking for them answered so).
        self.features = frozenset(features)
        self.files: dict[str, bytes] = _Files()
        self.temp: dict[str, bytes] = {}
        self.sent: list = []
        self.runs: list = []  # exec/eval requests not yet answered
        self.typed: list = []  # input events, in order
        self.closed: list = []
        self.session = None

    def attach(self, session):
        self.session = session
        session.capabilities = self.capabilities
        session.features = self.features
        return session

    @classmethod
    def connect(cls, registry, trapos_id="7:base", account_id="local", **kwargs):
        """A new one, registered in ``registry`` as ``trapos_id``."""
        computer = cls(**kwargs)
        registry.add(computer.attach(Session(account_id, trapos_id, computer, registry.clock)))
        return computer

    def close(self, code, reason):
        self.closed.append((code, reason))

    def send_frame(self, data):
        if type(data) is parts.BinaryFrame:
            assert wire.BINARY_PARTS in self.features, "a binary part to a client without them"
            assert len(data) <= limits.MAX_OUTBOUND_BYTES, len(data)
            header, _, raw = data.partition(b"\n")
            request = {**orjson.loads(header), "raw": raw}
        else:
            request = orjson.loads(data)
        self.sent.append(request)
        kind, payload = request["type"], request["payload"]
        if kind in ("exec", "eval"):
            self.runs.append(request)
            return
        handler = getattr(self, "on_" + kind, None)
        if handler is None:
            self.answer(request, ok=False, error={"code": "unknown_type", "message": kind})
            return
        handler(request, payload)

    def answer(self, request, ok=True, payload=None, error=None, partial=False):
        fields = {"partial": True} if partial else {}
        frame = response_frame(self.session.trapos_id, request, ok, payload, error, **fields)
        decoded = wire.decode(orjson.dumps(frame))
        assert isinstance(decoded, wire.ComputerResponse), decoded
        self.session.resolve(decoded)

    def fs_error(self, request, message):
        self.answer(request, ok=False, error={"code": "fs_error", "message": message})

    def on_cancel(self, request, payload):
        target = payload.get("messageId")
        running = [run for run in self.runs if run["messageId"] == target]
        for run in running:
            self.runs.remove(run)
            self.answer(run, ok=False, error={"code": "cancelled", "message": "cancelled"})
        self.answer(request, payload={"cancelled": bool(running)})

    def on_read_file(self, request, payload):
        content = self.files.get(payload["path"])
        if content is None:
            self.fs_error(request, f"/{payload['path'].lstrip('/')}: No such file")
            return
        binary = payload.get("encoding") == parts.BINARY
        assert not binary or wire.BINARY_PARTS in self.features, "binary asked of a client without"
        most = limits.BINARY_PART_BYTES if binary else 65536
        offset = payload.get("offset", 0)
        length = min(payload.get("length", most), most)
        chunk = content[offset : offset + length]
        answer = {
            "encoding": payload.get("encoding", "base64"),
            "sizeBytes": len(content),
            "offset": offset,
            "bytesRead": len(chunk),
        }
        if binary:  # as the client sends it: the frame, a newline, the bytes
            frame = response_frame(self.session.trapos_id, request, True, answer)
            decoded = parts.decode_response(orjson.dumps(frame) + b"\n" + chunk)
            assert isinstance(decoded, wire.ComputerResponse), decoded
            self.session.resolve(decoded)
            return
        self.answer(request, payload={**answer, "content": base64.b64encode(chunk).decode()})

    def on_write_file(self, request, payload):
        path = payload["path"]
        if "raw" in request:
            assert payload["encoding"] == parts.BINARY and "content" not in payload
            data = request["raw"]
            assert len(data) <= limits.BINARY_PART_BYTES, "a part carries at most 120 KiB"
        else:
            data = base64.b64decode(payload["content"])
            assert len(data) <= 65536, "a frame carries at most 64 KiB of content"
        if path.startswith("rom/") or path.startswith("/rom/"):
            self.fs_error(request, f"/{path.lstrip('/')}: Access denied")
            return
        part = payload.get("part") or {"offset": 0, "final": True}
        if part["offset"] != len(self.temp.get(path, b"")) and part["offset"] != 0:
            self.answer(request, ok=False, error={"code": "bad_request", "message": "offset"})
            return
        written = (b"" if part["offset"] == 0 else self.temp[path]) + data
        self.temp[path] = written
        if part["final"]:
            self.files[path] = self.temp.pop(path)
        self.answer(request, payload={"bytesWritten": len(data), "sizeBytes": len(written)})

    def on_write_files(self, request, payload):
        assert "raw" in request and payload["encoding"] == parts.BINARY, "a binary message"
        raw, written, at = request["raw"], [], 0
        assert sum(f["size"] for f in payload["files"]) == len(raw)
        for entry in payload["files"]:
            path, data = entry["path"], raw[at : at + entry["size"]]
            at += entry["size"]
            if path.startswith("/rom/"):
                failed = {"path": path, "code": "fs_error", "message": f"{path}: Access denied"}
                self.answer(request, payload={"written": written, "failed": failed})
                return
            self.files[path] = data
            written.append({"path": path, "sizeBytes": len(data)})
        self.answer(request, payload={"written": written})

    def on_list_files(self, request, payload):
        entries = [
            {"name": name, "type": "file", "size": len(data), "readOnly": False}
            for name, data in sorted(self.files.items())
        ]
        self.answer(request, payload={"path": payload["path"], "entries": entries})

    def on_delete_file(self, request, payload):
        deleted = self.files.pop(payload["path"], None) is not None
        self.answer(request, payload={"deleted": deleted})

    def on_input(self, request, payload):
        self.typed.extend(payload["events"])
        self.answer(request, payload={"queued": len(payload["events"])})

    # Peripherals and a turtle (SPEC §16): a monitor on top; a turtle without fuel.
    def on_list_peripherals(self, request, payload):
        monitor = {"name": "top", "types": ["monitor"], "methods": ["getSize", "write"]}
        self.answer(request, payload={"peripherals": [monitor]})

    def on_call_peripheral(self, request, payload):
        if payload["name"] != "top" or payload["method"] not in ("getSize", "write"):
            error = {"code": "peripheral_error", "message": f"No such method {payload['method']}"}
            self.answer(request, ok=False, error=error)
            return
        returns = [15, 5] if payload["method"] == "getSize" else []
        self.answer(request, payload={"returns": returns})

    def on_turtle(self, request, payload):
        returns = [False, "Out of fuel"] if payload["action"] == "forward" else [True]
        self.answer(request, payload={"returns": returns, "fuel": 0, "selected": 1})

    def on_screen(self, request, payload):
        self.answer(
            request,
            payload={"width": 51, "height": 19, "cursorX": 1, "cursorY": 2, "lines": ["> hi"]},
        )


class HeldComputer(SandboxComputer):
    """A computer that answers file parts (``read_file``, ``write_file``) only when told
    (``answer_next``), in the order they came."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.held = []

    def on_write_file(self, request, payload):
        self.held.append((request, payload))

    def on_read_file(self, request, payload):
        self.held.append((request, payload))

    def answer_next(self):
        request, payload = self.held.pop(0)
        getattr(super(), "on_" + request["type"])(request, payload)


class PausedComputer(HeldComputer):
    """A ``HeldComputer`` whose connection's transport is paused: what is sent waits in a
    real ``Outbound`` (``MAX_QUEUED_BYTES``; a send past it fails ``overloaded``, as on a
    connection) until ``read`` resumes the transport and the computer takes it all."""

    def __init__(self, clock, **kwargs):
        super().__init__(**kwargs)
        self.outbound = Outbound(super().send_frame, lambda: None, clock)
        self.outbound.pauseProducing()

    def send_frame(self, data):
        self.outbound.send(data)

    def read(self):
        self.outbound.resumeProducing()
        self.outbound.pauseProducing()
