"""
Issue 33 in cluster mode: two real ``twistd`` gateways on one real Redis,
``OPENCODE_URL`` the same two opencode servers for both; a computer's asks go
to the same server whichever process holds the computer (SPEC §11, §13).

The opencode servers are small fakes in the test: each keeps its event stream
open and refuses ``POST /session``, noting the directory it was for, so an ask
fails fast once it has reached the server it went to.
"""

from __future__ import annotations

import os

import orjson
from twisted.internet import endpoints
from twisted.trial.unittest import TestCase
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from tests.cluster.helpers import start_gateway
from tests.harness.redis import start_redis
from tests.harness.support import bounded, connect, reactor
from trapsandbox.opencode.directories import directory_name
from trapsandbox.opencode.servers import ranked


class Url:
    def __init__(self, url: str) -> None:
        self.url = url


class FakeOpencode(Resource):
    """Just enough opencode for an ask to choose it: its stream, its config, no sessions."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.sessions: list[str] = []  # the directories asks tried to open a session in
        self.streams: list = []

    def render_GET(self, request):
        request.setHeader(b"content-type", b"application/json")
        if request.path == b"/global/event":
            request.setHeader(b"content-type", b"text/event-stream")
            heartbeat = {"directory": "global", "payload": {"type": "server.heartbeat"}}
            request.write(b"data: " + orjson.dumps(heartbeat) + b"\n\n")
            self.streams.append(request)
            request.notifyFinish().addBoth(lambda _: self.streams.remove(request))
            return NOT_DONE_YET
        if request.path == b"/config":
            return b"{}"  # no trapsandbox MCP block: asks go without tools
        if request.path == b"/config/providers":
            return b'{"providers": [{"id": "fake"}], "default": {}}'
        return b'{"healthy": true, "version": "fake"}'

    def render_POST(self, request):
        if request.path == b"/session":
            self.sessions.append(request.args[b"directory"][0].decode())
        request.setResponseCode(500)
        request.setHeader(b"content-type", b"application/json")
        return b'{"name": "UnknownError", "data": {"message": "a fake opencode"}}'

    def stop(self) -> None:
        for request in list(self.streams):
            request.finish()


class AskServersInClusterTests(TestCase):
    timeout = 60

    async def fake_opencode(self) -> tuple[FakeOpencode, str]:
        fake = FakeOpencode()
        endpoint = endpoints.TCP4ServerEndpoint(reactor(), 0, interface="127.0.0.1")
        port = await bounded(endpoint.listen(Site(fake)))
        self.addCleanup(port.stopListening)
        self.addCleanup(fake.stop)
        return fake, f"http://127.0.0.1:{port.getHost().port}"

    async def ask(self, gateway, trapos_id: str) -> dict:
        """Ask from ``trapos_id`` held by ``gateway``; the ask's answer (refused by the fake)."""
        computer = await connect(self, gateway.port)
        hello = await computer.hello(trapos_id=trapos_id)
        self.assertTrue(hello["ok"], hello)
        answer = await computer.request("ask", {"prompt": "which server?"})
        computer.sendClose(1000)
        await computer.wait_closed()
        return answer

    async def test_every_process_sends_a_computers_asks_to_the_same_server(self):
        fakes = dict([await self.fake_opencode() for _ in range(2)])
        urls = ",".join(fakes.values())
        redis = await start_redis(self)
        a, b = [
            await start_gateway(
                self,
                redis.url,
                OPENCODE_URL=urls,
                SANDBOX_STATE_DIR=os.path.abspath(self.mktemp()),
            )
            for _ in range(2)
        ]
        computers = [f"{n}:c" for n in range(1, 7)]
        for gateway in (a, b, a):
            for trapos_id in computers:
                answer = await self.ask(gateway, trapos_id)
                self.assertFalse(answer["ok"], answer)
                self.assertIn("fake opencode", answer["error"]["message"])
        chosen: dict[str, set[str]] = {}
        for fake, url in fakes.items():
            for directory in fake.sessions:
                chosen.setdefault(os.path.basename(directory), set()).add(url)
        names = {directory_name("local", trapos_id) for trapos_id in computers}
        self.assertEqual(set(chosen), names)
        # One server per computer, through both processes, three times over: the first of
        # the computer's rendezvous ranking (not merely the first server listed).
        for trapos_id in computers:
            (first, *_) = ranked([Url(url) for url in fakes.values()], "local", trapos_id)
            self.assertEqual(chosen[directory_name("local", trapos_id)], {first.url}, trapos_id)
