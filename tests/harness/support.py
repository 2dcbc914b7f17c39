"""Real-socket helpers: a gateway on 127.0.0.1:0 and a WebSocket test computer."""

from __future__ import annotations

import os
import socket

import orjson
from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from twisted.internet import endpoints, ssl
from twisted.internet.defer import Deferred, DeferredQueue

from trapsandbox import config
from trapsandbox.admission import accounts
from trapsandbox.compat import fixes
from trapsandbox.fast import paths
from trapsandbox.tap import Gateway, build

WAIT = 10.0  # the bound on any single wait in a loopback test
# What every operator POST says it sends (SPEC §4: 415 otherwise).
JSON = {"content-type": "application/json"}


def reactor():
    from twisted.internet import reactor

    return reactor


def bounded(d: Deferred, seconds: float = WAIT) -> Deferred:
    return d.addTimeout(seconds, reactor())


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unbatch_timers(factory) -> None:
    fixes.plain_autobahn_timers(factory, reactor())


def fast_paths(testcase) -> bool:
    """The mode ``testcase`` runs the gateway in: fast (the default), or plain (``both_modes``)."""
    return getattr(testcase, "fast_paths", True)


def both_modes(namespace: dict, *names: str, only: tuple[str, ...] | None = None) -> None:
    """
    Beside each test class ``names`` of a module (``namespace``: its
    ``globals()``), its twin ``<name>Plain`` whose gateways run in plain mode
    (``SANDBOX_FAST_PATHS=0``): the plain path is the reference the fast one
    is held to, so the same tests run against both.  ``only``: the twin has
    just these tests (where the mode matters and a test is costly).
    """
    for name in names:
        cls = namespace[name]
        body = {"fast_paths": False, "__module__": namespace["__name__"], "__doc__": cls.__doc__}
        if only is None:
            twin = type(f"{name}Plain", (cls,), body)
        else:
            # A sibling, not a subclass: pytest and trial both collect what a class inherits.
            inherited = [t for t in dir(cls) if t.startswith("test") and t not in cls.__dict__]
            assert not inherited, f"{name}: only= cannot leave out inherited tests {inherited}"
            kept = {
                key: value
                for key, value in vars(cls).items()
                if key not in ("__dict__", "__weakref__")
                and (not key.startswith("test") or key in only)
            }
            twin = type(f"{name}Plain", cls.__bases__, {**kept, **body})
        namespace[twin.__name__] = twin


def start_gateway(testcase, **settings) -> Gateway:
    """
    A running gateway on an ephemeral loopback port, stopped at cleanup; in
    the testcase's mode (``fast_paths``): the fast paths installed, or the
    libraries as they ship.
    """
    settings.setdefault("ports", ("tcp:0:interface=127.0.0.1",))
    settings.setdefault("opencode_url", f"http://127.0.0.1:{closed_port()}")
    # Never the repository's ./state: the test's own folder.
    settings.setdefault("state_dir", os.path.abspath(testcase.mktemp()))
    fast = None
    if fast_paths(testcase):
        fast = paths.install()
    else:
        paths.uninstall()
    gateway = build(config.Settings(**settings), reactor(), fast=fast)
    unbatch_timers(gateway.factory)
    unbatch_timers(gateway.operator_socket)
    gateway.service.privilegedStartService()
    gateway.service.startService()
    testcase.addCleanup(lambda: gateway.service.running and gateway.service.stopService())
    return gateway


def response_frame(trapos_id: str, request, ok=True, payload=None, error=None, **fields) -> dict:
    """A computer_response to ``request``; ``fields`` override any key (bad values too)."""
    frame = {
        "event": "computer_response",
        "traposSenderId": trapos_id,
        "messageId": request["messageId"],
        "type": request["type"],
        "ok": ok,
    }
    if payload is not None:
        frame["payload"] = payload
    if error is not None:
        frame["error"] = error
    frame.update(fields)
    return frame


class TestComputer(WebSocketClientProtocol):
    """A computer speaking the SPEC's protocol; frames land in ``messages``."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: DeferredQueue = DeferredQueue()
        self.closed: Deferred = Deferred()
        self.trapos_id = "7:"
        self._ids = 0

    def onOpen(self) -> None:
        self.factory.opened.callback(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.messages.put(orjson.loads(payload))

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        if not self.factory.opened.called:
            self.factory.opened.errback(ConnectionError(f"closed: {code} {reason}"))
        self.closed.callback((code, reason))

    def next_message(self, seconds: float = WAIT) -> Deferred:
        return bounded(self.messages.get(), seconds)

    def send(self, obj) -> None:
        self.sendMessage(obj if isinstance(obj, bytes) else orjson.dumps(obj))

    def request(self, type: str, payload=None, seconds: float = WAIT) -> Deferred:
        """Send a computer_request; fires with the next frame received (within ``seconds``)."""
        self._ids += 1
        frame = {
            "event": "computer_request",
            "traposSenderId": self.trapos_id,
            "messageId": f"test-{self._ids}",
            "type": type,
            "payload": {} if payload is None else payload,
        }
        self.send(frame)
        return self.next_message(seconds)

    def hello(
        self, secret: str | None = None, trapos_id: str = "7:", capabilities=None, features=None
    ) -> Deferred:
        self.trapos_id = trapos_id
        payload = {"traposId": trapos_id, "version": "test"}
        if secret is not None:
            payload["secret"] = secret
        if capabilities is not None:
            payload["capabilities"] = list(capabilities)
        if features is not None:
            payload["features"] = list(features)
        return self.request("hello", payload)

    def respond(self, request, **fields) -> None:
        """Answer a gateway_request received from the gateway."""
        self.send(response_frame(self.trapos_id, request, **fields))

    def wait_closed(self) -> Deferred:
        return bounded(self.closed)


async def connect(
    testcase,
    port: int,
    path: str = "/gateway?n=1",
    trust: ssl.Certificate | None = None,
    protocol: type[TestComputer] | None = None,
) -> TestComputer:
    """A connected TestComputer (or ``protocol``); over TLS for ``localhost`` with ``trust``."""
    scheme = "wss" if trust else "ws"
    factory = WebSocketClientFactory(f"{scheme}://localhost:{port}{path}")
    endpoint = endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", port)
    if trust is not None:
        endpoint = endpoints.wrapClientTLS(
            ssl.optionsForClientTLS("localhost", trustRoot=trust), endpoint
        )
    return await _opened(testcase, factory, protocol or TestComputer, endpoint)


async def admitted(
    testcase, port: int, secret: str, trapos_id: str = "7:base", capabilities=(), features=None
) -> TestComputer:
    """A TestComputer connected to ``port`` and past its hello, allowing ``capabilities``
    (announcing ``features``, ``wire.FEATURES``, when given)."""
    computer = await connect(testcase, port)
    hello = await computer.hello(secret, trapos_id, capabilities, features)
    testcase.assertTrue(hello["ok"], hello)
    return computer


async def _opened(testcase, factory, protocol, endpoint):
    """``factory``'s ``protocol`` connected through ``endpoint`` and open; closed at cleanup."""
    factory.protocol = protocol
    factory.opened = Deferred()
    unbatch_timers(factory)
    factory.setProtocolOptions(
        maxMessagePayloadSize=0, maxFramePayloadSize=0, closeHandshakeTimeout=0.1
    )
    await bounded(endpoint.connect(factory))
    opened = await bounded(factory.opened)

    async def close():
        if not opened.closed.called:
            opened.sendClose(1000)
            await bounded(opened.closed)

    testcase.addCleanup(lambda: Deferred.fromCoroutine(close()))
    return opened


class Refused(Exception):
    """The gateway refused a WebSocket upgrade: its HTTP status line and headers."""

    def __init__(self, status: int | None, line: str, headers: dict) -> None:
        super().__init__(line)
        self.status = status
        self.headers = headers


class TestOperator(WebSocketClientProtocol):
    """An operator on ``/operator``: messages land in ``messages``, decoded."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: DeferredQueue = DeferredQueue()
        self.closed: Deferred = Deferred()
        self.close_code: int | None = None

    def onOpen(self) -> None:
        self.factory.opened.callback(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.messages.put(orjson.loads(payload))

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self.close_code = code
        if not self.factory.opened.called:
            line = getattr(self, "http_status_line", None) or str(reason)
            parts = line.split()
            status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
            headers = getattr(self, "http_headers", None) or {}
            self.factory.opened.errback(Refused(status, line, headers))
        self.closed.callback((code, reason))

    def send(self, obj, binary: bool = False) -> None:
        self.sendMessage(obj if isinstance(obj, bytes) else orjson.dumps(obj), binary)

    def next_message(self) -> Deferred:
        return bounded(self.messages.get())

    async def answers(self, count: int) -> list:
        return [await self.next_message() for _ in range(count)]

    def wait_closed(self) -> Deferred:
        return bounded(self.closed)


async def connect_operator(
    testcase, port: int, token: str | None = None, origin: str | None = None
) -> TestOperator:
    """A ``TestOperator`` on ``/operator``, with ``token`` as its bearer token; or ``Refused``."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    factory = WebSocketClientFactory(
        f"ws://127.0.0.1:{port}/operator", headers=headers, origin=origin
    )
    endpoint = endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", port)
    return await _opened(testcase, factory, TestOperator, endpoint)


def account_table(name: str, secret: str | None = None) -> str:
    """One account of an accounts file: secret ``secret`` (default "s-NAME"), token "token-NAME"."""
    return (
        f"[accounts.{name}]\n"
        f'secret_sha256 = "{accounts.sha256_hex(secret or "s-" + name)}"\n'
        f'token_sha256 = "{accounts.sha256_hex("token-" + name)}"\n'
    )


def accounts_file(testcase, *names: str) -> str:
    """An accounts file of ``names`` (``account_table``'s secrets and tokens); its path."""
    path = os.path.abspath(testcase.mktemp())
    with open(path, "w") as f:
        f.write("".join(account_table(name) for name in names))
    return path
